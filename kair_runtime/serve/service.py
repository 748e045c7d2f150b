"""The service behind the routes: loading state, the scheduler, and one request's job.

    service = Service(cfg=cfg, build=default_builder(cfg)); service.load()  # on a background thread
    job = Job(service, req, EventBridge(asyncio.get_running_loop()), stream=False)

`Service` owns the loaded model and retriever and validates requests against the server's limits;
`Job` submits one request to the `Scheduler` and receives its events, which `EventBridge` carries
from the worker thread to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from kair_runtime.index import INDEX_FORMATS, get_format
from kair_runtime.llm import close_llm
from kair_runtime.llm.base import LLM
from kair_runtime.records import Question, Step, Trace, question_problem
from kair_runtime.retrieval.base import Retriever
from kair_runtime.runtime import build_llm, retriever_over
from kair_runtime.serve.bodies import AnswerRequest, RequestError, answer_body, corpus_size, step_summary, versions
from kair_runtime.serve.config import ServeConfig
from kair_runtime.serve.metrics import Metrics
from kair_runtime.serve.scheduler import Scheduler, SchedulerBusy, Settings, Ticket

log = logging.getLogger("kair.serve")

Builder = Callable[[], tuple[LLM, Retriever]]  # loads the model and the index (slow)


@dataclass
class Service:
    """Loading state, the loaded components and the scheduler; one per app."""

    cfg: ServeConfig
    build: Builder
    status: str = "loading"  # loading | ready | failed
    error: Optional[str] = None
    llm: Optional[LLM] = None
    retriever: Optional[Retriever] = None
    scheduler: Optional[Scheduler] = None
    load_s: Optional[float] = None
    metrics: Metrics = field(default_factory=Metrics)
    _closing: threading.Event = field(default_factory=threading.Event)

    def load(self) -> None:
        """Runs on a background thread: build the model and retriever, then start the worker."""
        t0 = time.perf_counter()
        try:
            llm, retriever = self.build()
        except Exception as e:  # noqa: BLE001 - reported by /healthz and every request
            log.exception("loading failed")
            self.error, self.status = f"{type(e).__name__}: {e}", "failed"
            return
        s = self.cfg.server
        sched = Scheduler(llm, retriever, self.cfg.loop, max_batch=s.max_batch,
                          batch_wait_ms=s.batch_wait_ms, max_queue=s.max_queue, on_round=self.metrics.round)
        self.metrics.watch_queue(sched.queued)
        sched.start()
        self.llm, self.retriever, self.scheduler = llm, retriever, sched
        self.load_s = time.perf_counter() - t0
        if self._closing.is_set():  # the app shut down while we were loading
            sched.close()
            close_llm(llm)
            return
        self.status = "ready"
        log.info("ready in %.1fs: %s with %s", self.load_s, getattr(llm, "name", "?"),
                 getattr(retriever, "name", "?"))

    def close(self) -> None:
        self._closing.set()
        if self.scheduler is not None:
            self.scheduler.close()  # joins the worker: nothing uses the model after this
        if self.llm is not None:
            close_llm(self.llm)  # vLLM's engine processes would otherwise outlive the app

    def ready_scheduler(self) -> Scheduler:
        if self.status == "failed":
            raise RequestError(503, f"the model or index failed to load: {self.error}")
        if self.status != "ready" or self.scheduler is None:
            raise RequestError(503, "the model and index are still loading; retry shortly (see /healthz)")
        if not self.scheduler.running:
            raise RequestError(503, "the batching worker has stopped (server shutting down)")
        return self.scheduler

    def allowed_formats(self) -> list[str]:
        names = self.cfg.server.index_formats or list(INDEX_FORMATS)
        return sorted({get_format(n).name for n in names} | {get_format(self.cfg.loop.index_format).name})

    def settings_for(self, req: AnswerRequest) -> tuple[Question, Settings]:
        """Validate a request against the server's limits; every problem is a 422 naming the field."""
        s, loop = self.cfg.server, self.cfg.loop
        problem = question_problem(req.question)
        if problem:
            raise RequestError(422, f"question: {problem}")
        text = req.question.strip()
        if len(text) > s.max_question_chars:
            raise RequestError(422, f"question: {len(text)} characters is over the limit of "
                                    f"{s.max_question_chars} (server.max_question_chars)")
        max_steps = loop.max_steps if req.max_steps is None else req.max_steps
        if not 1 <= max_steps <= s.max_steps_limit:
            raise RequestError(422, f"max_steps: must be between 1 and {s.max_steps_limit}, got {max_steps}")
        top_k = loop.top_k if req.top_k is None else req.top_k
        if not 1 <= top_k <= s.max_top_k:
            raise RequestError(422, f"top_k: must be between 1 and {s.max_top_k}, got {top_k}")
        allowed = self.allowed_formats()
        name = loop.index_format if req.index_format is None else req.index_format
        try:
            fmt = get_format(name).name
        except KeyError:
            fmt = None
        if fmt not in allowed:
            raise RequestError(422, f"index_format: unknown or not served: {name!r}; choose one of {allowed}")
        question = Question(id=uuid.uuid4().hex[:12], question=text)
        return question, Settings(index_format=fmt, top_k=top_k, max_steps=max_steps)


class EventBridge:
    """Carries events from the worker thread to the event loop, one wake-up per burst.

    Each `call_soon_threadsafe` wakes the event loop through a socket, and under load every such
    hand-off costs the worker a GIL switch (milliseconds). A round finishes many questions at
    once, so events are buffered and the loop is woken only when the buffer goes from empty to
    non-empty; it then delivers the whole burst.
    """

    def __init__(self, aloop: asyncio.AbstractEventLoop):
        self._aloop = aloop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue, Any]] = []

    def post(self, q: asyncio.Queue, item: Any) -> None:
        with self._lock:
            self._items.append((q, item))
            wake = len(self._items) == 1
        if wake:
            try:
                self._aloop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the event loop is closed: the server is gone, nobody is waiting
                pass

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for q, item in items:
            q.put_nowait(item)


class Job:
    """One request's side of a ticket: the worker's events arrive on an asyncio queue."""

    def __init__(self, service: Service, req: AnswerRequest, bridge: EventBridge, stream: bool):
        self.started = time.perf_counter()
        self.question, self.settings = service.settings_for(req)
        self.return_trace = req.return_trace
        self.timeout_s = service.cfg.server.request_timeout_s
        self.stream = stream
        self._metrics = service.metrics
        self._first_step = True
        self._bridge = bridge
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        try:
            self.ticket: Ticket = service.ready_scheduler().submit(self.question, self.settings, self._notify)
        except SchedulerBusy as e:
            raise RequestError(503, str(e)) from None

    def _notify(self, kind: str, trace: Trace, step: Optional[Step]) -> None:
        if step is not None and self._first_step:
            self._first_step = False
            self._metrics.first_step.observe(time.perf_counter() - self.started)
        if kind == "answer":
            self._metrics.answered(trace)
        if step is not None and not self.stream:
            return  # a plain request only needs the answer
        # Worker thread: build the step payload now, while the trace is exactly at this step.
        payload = step_summary(trace, step) if step is not None else trace
        self._bridge.post(self._events, (kind, payload))

    def remaining(self) -> float:
        return self.timeout_s - (time.perf_counter() - self.started)

    async def next_event(self, wait_s: float) -> Optional[tuple[str, Any]]:
        """The next ("step", dict) or ("answer", Trace); None if nothing came within wait_s."""
        try:
            return await asyncio.wait_for(self._events.get(), max(0.0, wait_s))
        except asyncio.TimeoutError:
            return None

    def timeout_error(self) -> RequestError:
        return RequestError(504, f"no answer within {self.timeout_s:g}s (server.request_timeout_s); "
                                 f"the request was cancelled")

    def result(self, trace: Trace) -> dict[str, Any]:
        """The response body for a finished trace, or the 502 its error deserves."""
        if trace.error:
            raise RequestError(502, f"the backend failed on this request: {trace.error}")
        return answer_body(trace, self.settings, time.perf_counter() - self.started, self.return_trace)


def default_builder(cfg: ServeConfig) -> Builder:
    return lambda: (build_llm(cfg.llm), retriever_over(cfg.retriever)[0])

def info_body(service: Service) -> dict[str, Any]:
    cfg, sched = service.cfg, service.scheduler
    r = cfg.retriever
    return {
        "status": service.status,
        "model": {"backend": cfg.llm.backend, "name": cfg.llm.model, "adapter": cfg.llm.adapter,
                  "loaded_as": getattr(service.llm, "name", None), "load_s": service.load_s},
        "retriever": {"kind": r.kind, "name": getattr(service.retriever, "name", None),
                      "encoder": r.encoder if r.kind == "dense" else None, "index_dir": r.index_dir,
                      "corpus": r.corpus or (None if r.index_dir or r.kind == "remote" else "embedded demo corpus"),
                      "corpus_size": corpus_size(service.retriever)},
        "index_format": get_format(cfg.loop.index_format).name,
        "index_formats": service.allowed_formats(),
        "defaults": {"max_steps": cfg.loop.max_steps, "top_k": cfg.loop.top_k},
        "limits": {"max_question_chars": cfg.server.max_question_chars, "max_body_bytes": cfg.server.max_body_bytes,
                   "max_steps": cfg.server.max_steps_limit, "max_top_k": cfg.server.max_top_k,
                   "request_timeout_s": cfg.server.request_timeout_s},
        "batching": {"max_batch": cfg.server.max_batch, "batch_wait_ms": cfg.server.batch_wait_ms,
                     "queued": sched.queued() if sched else 0,
                     **(asdict(sched.stats) if sched else {})},
        "versions": versions(),
    }

def log_request(job: Job, trace: Trace, status: int) -> None:
    log.info("request %s: %d, %d steps (%s), %.2fs", job.question.id, status, len(trace.steps),
             trace.stop_reason, time.perf_counter() - job.started)
