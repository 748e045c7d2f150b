"""Test-only helpers for tests that start a real process: a server (kair serve, vLLM's OpenAI
server), or one that holds an output folder as a running command would."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, proc: subprocess.Popen, timeout: float) -> None:
    """Poll `url` until it answers 200; fail early, with the process's output, if it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the server exited with {proc.returncode} before {url} answered:\n{out[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} did not answer 200 within {timeout:.0f}s")


def stop(proc: subprocess.Popen, timeout: float = 60) -> int:
    """Ctrl+C, as a user would stop it; kill only if it does not end in time."""
    import signal

    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def holder_process(folder) -> subprocess.Popen:
    """Another process that holds `folder` until it is killed; returns once it holds it."""
    code = textwrap.dedent(f"""
        import sys, time
        from kair_runtime.rundir import hold
        with hold({str(folder)!r}):
            print("held", flush=True)
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, "kair", "eval", "--run-name", "r"], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc
