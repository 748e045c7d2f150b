"""The `kair serve` command: load a serve config and run the app under uvicorn.

    kair serve --config configs/serve/default.yaml [--host 127.0.0.1] [--port 8000] [--api-key KEY]

The main CLI mounts it with `app.command("serve")(serve)`; this module imports uvicorn and the
app only inside the function, so mounting costs nothing when the serve extra is absent.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Optional

import typer

API_KEY_ENV = "KAIR_API_KEY"


def serve(
    config: str = typer.Option(..., "--config", "-c", help="A configs/serve/*.yaml (or configs/runtime/*.yaml) file."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; the default serves this machine only."),
    port: int = typer.Option(8000, help="TCP port."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar=API_KEY_ENV,
                                          help=f"Require 'Authorization: Bearer KEY' on /v1 routes (or set ${API_KEY_ENV})."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: --set server.max_batch=32"),
    log_level: str = typer.Option("info", help="uvicorn and kair.serve log level."),
) -> None:
    """Serve the KAIR loop over HTTP: /v1/answer, /v1/answer/stream, /healthz, /v1/info and a demo page at /."""
    from kair_runtime.config import TCP_PORT, ConfigError, check_range
    from kair_runtime.serve.config import load_serve_config

    try:
        check_range(port, TCP_PORT, "--port")  # before the model loads: uvicorn finds out only at bind
        cfg = load_serve_config(config, set_)
    except ConfigError as e:
        typer.echo(f"config error: {e}", err=True)
        raise typer.Exit(2)
    if not api_key and not _is_loopback(host):
        typer.echo(f"warning: serving on {host} without an API key; anyone who can reach it can use the "
                   f"model (pass --api-key or set ${API_KEY_ENV})", err=True)
    run(cfg, host=host, port=port, api_key=api_key, log_level=log_level)


def run(cfg, *, host: str = "127.0.0.1", port: int = 8000, api_key: Optional[str] = None,
        log_level: str = "info") -> None:
    try:
        import uvicorn

        from kair_runtime.serve.app import create_app
    except ImportError as e:
        typer.echo(f"`kair serve` needs the serve extra ({e}): pip install -e '.[serve]'", err=True)
        raise typer.Exit(2)

    # Only our logger: the root logger's level would also turn on other libraries' debug output.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    kair_log = logging.getLogger("kair")
    kair_log.addHandler(handler)
    kair_log.setLevel(log_level.upper())
    # A bounded graceful shutdown: an open stream must not keep Ctrl+C waiting for minutes.
    uvicorn.run(create_app(cfg, api_key=api_key), host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=10)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main() -> None:
    """`python -m kair_runtime.serve.cli --config ...`, for use before the command is mounted."""
    typer.run(serve)


if __name__ == "__main__":
    main()
