"""Run the app under uvicorn on a background thread: for the browser test and the load benchmark.

    with BackgroundServer(app) as server:       # binds 127.0.0.1 on a free port
        httpx.get(server.url + "/healthz")
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class BackgroundServer:
    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0):
        # port 0: the OS picks a free port; we read it back once the socket is bound.
        self.config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(self.config)
        self.start_timeout_s = start_timeout_s
        self.thread = threading.Thread(target=self.server.run, name="kair-uvicorn", daemon=True)
        self.url = ""

    def __enter__(self) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.config.host}:{self.config.port}")
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Poll /healthz until the model is loaded (200), or raise with its last answer."""
        import httpx

        deadline, last = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            r = httpx.get(self.url + "/healthz", timeout=5)
            if r.status_code == 200:
                return
            last = r.json()
            if last.get("status") == "failed":
                break
            time.sleep(0.1)
        raise RuntimeError(f"server not ready: {last}")
