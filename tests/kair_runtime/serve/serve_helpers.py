"""Helpers for the serve tests: the app built on real tiny components (ScriptedLLM, WordOverlap)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from fastapi.testclient import TestClient  # noqa: E402

from kair_runtime.config import LLMConfig, LoopConfig  # noqa: E402
from kair_runtime.llm.scripted import ScriptedLLM, echo_kair  # noqa: E402
from kair_runtime.serve.app import create_app  # noqa: E402
from kair_runtime.serve.config import ServeConfig, ServerConfig  # noqa: E402
from lexical import WordOverlap  # noqa: E402


def serve_config(loop: dict | None = None, llm: dict | None = None, **server) -> ServeConfig:
    return ServeConfig(llm=LLMConfig(**(llm or {})), loop=LoopConfig(**{"max_steps": 3, "top_k": 3, **(loop or {})}),
                       server=dataclasses.replace(ServerConfig(batch_wait_ms=5.0), **server))


def wait_ready(client: TestClient, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/healthz").status_code == 200:
            return
        time.sleep(0.01)
    raise AssertionError(f"server not ready after {timeout}s: {client.get('/healthz').json()}")


@contextmanager
def serving(llm=None, retriever=None, *, api_key: str | None = None, build=None, ready: bool = True,
            loop: dict | None = None, llm_config: dict | None = None, **server) -> Iterator[TestClient]:
    """A TestClient on the app with its lifespan running (the model loads on a thread).
    `llm_config` only sets what the config says (e.g. the adapter path /healthz shows)."""
    llm = llm if llm is not None else ScriptedLLM(echo_kair)
    retriever = retriever if retriever is not None else WordOverlap()
    app = create_app(serve_config(loop, llm_config, **server), api_key=api_key, build=build or (lambda: (llm, retriever)))
    with TestClient(app) as client:
        if ready:
            wait_ready(client)
        yield client


def parse_sse(text: str) -> list[tuple[str, dict]]:
    """Server-sent events -> [(event, data)], skipping comment (keepalive) lines."""
    events = []
    for block in text.strip().split("\n\n"):
        name, data = "message", []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[len("event:"):].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:"):].strip())
        if data:
            events.append((name, json.loads("\n".join(data))))
    return events


def insufficient_kair(messages) -> str:
    """Well-formed output that never stops early, so every question runs to max_steps."""
    prompt = messages[-1]["content"]
    if "short answer only" in prompt:
        return "unknown"
    return ("<index>\nKeywords: Coldplay, London\nRelationships:\nColdplay -> formed in -> London\n</index>\n"
            "<reasoning>Not enough yet. Judgment: insufficient</reasoning>\n<query>Coldplay London</query>")


class GatedLLM(ScriptedLLM):
    """A ScriptedLLM whose generate() waits for `gate` (set by the test), to hold a round open."""

    def __init__(self, respond=echo_kair, gate_calls: int = 1):
        super().__init__(respond)
        self.gate = threading.Event()
        self.entered = threading.Event()  # set once a gated call is in progress
        self.gate_calls = gate_calls

    def generate(self, prompts, sampling):
        if len(self.calls) < self.gate_calls:
            self.entered.set()
            self.gate.wait(10)
        return super().generate(prompts, sampling)
