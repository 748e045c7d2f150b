"""A small OpenAI-compatible chat completions server for tests (stdlib only, 127.0.0.1, random port).

It answers deterministically from the prompt: "echo: <last message content>", cut to
`max_tokens` words (finish_reason "length") or at the first stop string, with word counts as
usage. It can fail its first N requests with a status (503) to exercise retries, answers
404 for the model name "missing-model", and records every request it received. GET /v1/models
lists one model owned by `owned_by` ("vllm" makes it look like a vLLM server); its GETs are
counted in `model_lists`.

    with OpenAITestServer(fail_first=2) as server:
        llm = OpenAIBackend(server.base_url, "kair")
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def answer_for(messages: list[dict], max_tokens: int, stop: list[str]) -> tuple[str, str]:
    """The reply text and its finish_reason for a request, as the server computes them."""
    words = f"echo: {messages[-1]['content']}".split()
    finish = "length" if len(words) > max_tokens else "stop"
    text = " ".join(words[:max_tokens])
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    if hits:
        text, finish = text[:min(hits)], "stop"
    return text, finish


class OpenAITestServer:
    def __init__(self, fail_first: int = 0, fail_status: int = 503, delay_s: float = 0.0,
                 owned_by: str = "kair-tests"):
        self.fail_first, self.fail_status, self.delay_s = fail_first, fail_status, delay_s
        self.owned_by = owned_by
        self.model_lists = 0
        self.requests: list[dict] = []  # JSON bodies, in arrival order
        self.headers: list[dict[str, str]] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        # A short poll interval: shutdown() waits for it, on every test's exit.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> "OpenAITestServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _reply(self, body: dict, n: int) -> tuple[int, dict]:
        """The status and JSON for the n-th request (0-based)."""
        if n < self.fail_first:
            return self.fail_status, {"error": {"message": "server warming up"}}
        if body.get("model") == "missing-model":
            return 404, {"error": {"message": "The model `missing-model` does not exist."}}
        msgs = body["messages"]
        text, finish = answer_for(msgs, int(body.get("max_tokens", 16)), list(body.get("stop") or []))
        prompt_words = sum(len(m["content"].split()) for m in msgs)
        return 200, {"id": f"chatcmpl-{n}", "object": "chat.completion", "model": body["model"],
                     "choices": [{"index": 0, "finish_reason": finish,
                                  "message": {"role": "assistant", "content": text}}],
                     "usage": {"prompt_tokens": prompt_words, "completion_tokens": len(text.split()),
                               "total_tokens": prompt_words + len(text.split())}}

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                with server._lock:
                    server.model_lists += 1
                status, reply = ((200, {"object": "list", "data": [
                    {"id": "kair", "object": "model", "owned_by": server.owned_by}]})
                    if self.path == "/v1/models" else (404, {"error": {"message": f"no route {self.path}"}}))
                self._send(status, reply)

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    n = len(server.requests)
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(server.delay_s)
                    status, reply = (server._reply(body, n) if self.path == "/v1/chat/completions"
                                     else (404, {"error": {"message": f"no route {self.path}"}}))
                finally:
                    with server._lock:
                        server.in_flight -= 1
                self._send(status, reply)

            def _send(self, status: int, reply: dict) -> None:
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep test output clean
                pass

        return Handler
