"""A retriever that calls an HTTP retrieval service, and a minimal server of the same shape.

    POST {url}/search  {"queries": ["...", ...], "k": 5}
      -> {"results": [[{"id", "title", "text", "score"}, ...], ...]}   one list per query

`serve_retriever` puts any local Retriever behind that API (what `kair index serve` runs), with
the standard library's threaded HTTP server: enough for one box of workers sharing one index,
no extra dependency. It binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import httpx

from kair_runtime.config import RetrieverConfig
from kair_runtime.records import ScoredPassage
from kair_runtime.retrieval.base import Retriever

log = logging.getLogger(__name__)


class RemoteRetrievalError(RuntimeError):
    pass


class RemoteRetriever:
    name = "remote"

    def __init__(self, url: str, timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        self.client = httpx.Client(timeout=timeout_s)

    @classmethod
    def from_config(cls, cfg: RetrieverConfig) -> "RemoteRetriever":
        if not cfg.url:
            raise ValueError("retriever.url is required for retriever.kind: remote "
                             "(e.g. http://127.0.0.1:8000, from `kair index serve`)")
        return cls(cfg.url, cfg.timeout_s)

    def search(self, queries: list[str], k: int) -> list[list[ScoredPassage]]:
        if not queries:
            return []
        endpoint = f"{self.url}/search"
        try:
            response = self.client.post(endpoint, json={"queries": queries, "k": k})
        except httpx.TimeoutException:
            raise RemoteRetrievalError(f"retrieval service {endpoint} did not answer within "
                                       f"{self.client.timeout.read}s (retriever.timeout_s)") from None
        except httpx.TransportError as e:
            raise RemoteRetrievalError(f"retrieval service {endpoint} is unreachable: {e}; "
                                       f"is `kair index serve` running there?") from None
        if response.status_code != 200:
            raise RemoteRetrievalError(f"retrieval service {endpoint} answered HTTP {response.status_code}: "
                                       f"{response.text[:500]}")
        return _parse_results(response, endpoint, len(queries))

    def close(self) -> None:
        self.client.close()


def _parse_results(response: httpx.Response, endpoint: str, n: int) -> list[list[ScoredPassage]]:
    try:
        results = response.json()["results"]
        if not isinstance(results, list) or len(results) != n:
            raise ValueError(f"expected {n} result lists")
        return [[ScoredPassage.from_dict(d) for d in per_query] for per_query in results]
    except (ValueError, KeyError, TypeError) as e:
        raise RemoteRetrievalError(f"retrieval service {endpoint} sent a malformed answer ({e}): "
                                   f"{response.text[:200]}") from None


# ---------------------------------------------------------------- server

def _handler(retriever: Retriever, lock: threading.Lock) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/health":
                self._reply(200, {"status": "ok", "retriever": retriever.name})
            else:
                self._reply(404, {"error": f"no route GET {self.path}; use POST /search"})

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/search":
                self._reply(404, {"error": f"no route POST {self.path}; use POST /search"})
                return
            try:
                queries, k = _read_request(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            except ValueError as e:
                self._reply(400, {"error": str(e)})
                return
            try:
                with lock:  # encoders and indexes are not all thread-safe; batching is per request
                    results = retriever.search(queries, k)
            except Exception as e:  # the client must see why, not a dropped connection
                log.exception("search failed")
                self._reply(500, {"error": f"{type(e).__name__}: {e}"})
                return
            self._reply(200, {"results": [[vars(p) for p in per_query] for per_query in results]})

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


def _read_request(body: bytes) -> tuple[list[str], int]:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"request body is not JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise ValueError('expected {"queries": [...], "k": k}')
    queries, k = data.get("queries"), data.get("k", 5)
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError('"queries" must be a list of strings')
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f'"k" must be an integer >= 1, got {k!r}')
    return queries, k


def make_server(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """A server ready to `serve_forever()`; port 0 picks a free port (see `server.server_port`)."""
    server = ThreadingHTTPServer((host, port), _handler(retriever, threading.Lock()))
    server.daemon_threads = True
    return server


def serve_retriever(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000,
                    ready: Callable[[int], None] | None = None) -> None:
    """Serve until interrupted; `ready` gets the bound port (the OS's choice for port 0)."""
    server = make_server(retriever, host, port)
    if ready is not None:
        ready(server.server_port)
    log.info("serving %s retriever on http://%s:%d/search", retriever.name, host, server.server_port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
