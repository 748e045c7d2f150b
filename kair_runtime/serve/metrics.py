"""Prometheus metrics of `kair serve`, scraped at GET /metrics in the text exposition format.

    metrics = Metrics(); metrics.request("/v1/answer", 200, 1.3); text = metrics.render()

One registry per app (no process-global collectors: two apps in one process, as in the tests,
count apart). The names follow Prometheus' conventions (base units, `_total` counters):

    kair_requests_total{route,status}             finished HTTP requests
    kair_request_duration_seconds{route}          whole request, a stream until its last byte
    kair_time_to_first_step_seconds               submission -> the first loop step finished
    kair_batch_questions                          questions advanced together in one loop round
    kair_steps_per_question                       loop steps of each answered question
    kair_prompt_tokens_total, kair_completion_tokens_total
    kair_questions_total{outcome}                 answered questions: ok | backend_error
    kair_backend_errors_total                     questions the backend or retriever failed
    kair_queue_waiting                            requests waiting for a batch slot (at scrape time)

Observations come from the event loop (requests) and the scheduler's worker thread (rounds,
steps, answers); prometheus_client's collectors are thread-safe.
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable, Iterable, MutableMapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kair_runtime.records import Trace

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Latencies of a CPU-served 135M model (seconds per request) up to a 7B model on a busy GPU.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STEP_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)


class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter("kair_requests", "Finished HTTP requests by route and status code",
                                ["route", "status"], registry=r)
        self.duration = Histogram("kair_request_duration_seconds", "Whole request, a stream until its last byte",
                                  ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_step = Histogram("kair_time_to_first_step_seconds",
                                    "From a question's submission to its first finished loop step",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.batch = Histogram("kair_batch_questions", "Questions advanced together in one loop round",
                               buckets=BATCH_BUCKETS, registry=r)
        self.steps = Histogram("kair_steps_per_question", "Loop steps of each answered question",
                               buckets=STEP_BUCKETS, registry=r)
        self.prompt_tokens = Counter("kair_prompt_tokens", "Prompt tokens of answered questions (steps + answer)",
                                     registry=r)
        self.completion_tokens = Counter("kair_completion_tokens",
                                         "Completion tokens of answered questions (steps + answer)", registry=r)
        self.questions = Counter("kair_questions", "Questions the loop finished, by outcome", ["outcome"],
                                 registry=r)
        self.backend_errors = Counter("kair_backend_errors", "Questions the backend or retriever failed",
                                      registry=r)
        self.waiting = Gauge("kair_queue_waiting", "Requests waiting for a batch slot", registry=r)

    def watch_queue(self, queued: Callable[[], int]) -> None:
        """Read the scheduler's queue length at scrape time (the scheduler starts after the app)."""
        self.waiting.set_function(queued)

    def request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, status=str(status)).inc()
        self.duration.labels(route=route).observe(seconds)

    def round(self, questions: int) -> None:
        self.batch.observe(questions)

    def answered(self, trace: Trace) -> None:
        """One finished question: its steps and tokens, or a backend error."""
        if trace.error:
            self.backend_errors.inc()
            self.questions.labels(outcome="backend_error").inc()
            return
        self.questions.labels(outcome="ok").inc()
        self.steps.observe(len(trace.steps))
        self.prompt_tokens.inc(trace.usage.prompt_tokens)
        self.completion_tokens.inc(trace.usage.completion_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetrics:
    """ASGI middleware: every HTTP request's route, status and duration into `metrics`; a stream
    is timed until its last byte. Paths that are not a route count as "other", so a scan of
    random URLs cannot grow the label set."""

    def __init__(self, app: Callable[..., Awaitable[None]], metrics: Metrics, routes: Iterable[str]):
        self.app, self.metrics, self.routes = app, metrics, frozenset(routes)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0, status = time.perf_counter(), 500  # an exception before the response starts is a 500

        async def tracked_send(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        finally:
            route = scope.get("path", "") if scope.get("path", "") in self.routes else "other"
            self.metrics.request(route, status, time.perf_counter() - t0)
