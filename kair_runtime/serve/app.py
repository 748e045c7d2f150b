"""The HTTP API around the KAIR loop.

    app = create_app(load_serve_config("configs/serve/default.yaml"), api_key="secret")
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes:
    POST /v1/answer         {question, max_steps?, top_k?, index_format?, return_trace?}
                            -> {id, answer, index, steps, usage, latency_s, ...} (+ trace)
    POST /v1/answer/stream  the same request; server-sent events: start, step..., answer | error
    GET  /healthz           200 once the model, adapter and retriever are loaded; 503 before. With an
                            API key, only {status} unless the request carries the key
    GET  /v1/info           model, adapter, retriever, corpus size, formats, limits, versions
    GET  /                  the demo page (static/index.html)

The model loads on a background thread after startup, so /healthz can answer 503 "loading"
meanwhile. Every request goes to the `Scheduler`'s worker thread, which batches concurrent
requests into the loop's rounds; its callbacks cross back to the event loop with
`call_soon_threadsafe`. Errors: 401 bad or missing key, 422 invalid request, 502 the backend or
retriever failed for this request, 503 not loaded / busy / shutting down, 504 timed out, 413 a
body over server.max_body_bytes (refused before it is read whole).
"""

from __future__ import annotations

import asyncio
import hmac
import importlib.metadata
import json
import logging
import platform
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, field_validator
from pydantic_core import PydanticCustomError

from kair_runtime.index import INDEX_FORMATS, empty_index, get_format
from kair_runtime.llm import build_llm, close_llm
from kair_runtime.llm.base import LLM
from kair_runtime.records import Index, Question, Step, Trace
from kair_runtime.retrieval import build_retriever
from kair_runtime.retrieval.base import Retriever
from kair_runtime.serve.body_limit import BodyLimit
from kair_runtime.serve.config import ServeConfig
from kair_runtime.serve.scheduler import Scheduler, SchedulerBusy, Settings, Ticket

log = logging.getLogger("kair.serve")

Builder = Callable[[], tuple[LLM, Retriever]]  # loads the model and the index (slow)
VERSIONED = ("kair", "fastapi", "uvicorn", "pydantic", "torch", "transformers", "peft",
             "sentence-transformers", "faiss-cpu", "bm25s", "vllm", "openai")


class AnswerRequest(BaseModel):
    # Unknown fields are an error: a misspelt "max_step" must not silently fall back to a default.
    # Strict: a JSON value must already have the field's type. Lax mode would read "3", 2.0 and
    # true as max_steps=3, 2, 1 and "true" as return_trace, hiding a client's bug behind a guess.
    # The ranges of max_steps and top_k depend on the server's limits: `Service.settings_for`.
    model_config = ConfigDict(extra="forbid", strict=True)

    question: str
    max_steps: Optional[int] = None
    top_k: Optional[int] = None
    index_format: Optional[str] = None
    return_trace: bool = False

    @field_validator("question", "index_format")
    @classmethod
    def unicode_text(cls, value: Optional[str]) -> Optional[str]:
        # JSON may carry a lone surrogate escape ("\ud800") that Python decodes into a str that
        # is not Unicode text: it cannot be encoded as UTF-8, so the tokenizer, the retriever and
        # the response writer would each fail on it later, as a 502 or a broken stream.
        if value is not None:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise PydanticCustomError(
                    "lone_surrogate", "not valid Unicode text: a lone surrogate U+{code} at character "
                    "{position}; send UTF-8 text", {"code": f"{ord(value[e.start]):04X}", "position": e.start})
        return value


class RequestError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


# ---------------------------------------------------------------- the service behind the routes

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
                          batch_wait_ms=s.batch_wait_ms, max_queue=s.max_queue)
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
        text = req.question.strip()
        if not text:
            raise RequestError(422, "question: must not be empty")
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
        self._bridge = bridge
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        try:
            self.ticket: Ticket = service.ready_scheduler().submit(self.question, self.settings, self._notify)
        except SchedulerBusy as e:
            raise RequestError(503, str(e)) from None

    def _notify(self, kind: str, trace: Trace, step: Optional[Step]) -> None:
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


# ---------------------------------------------------------------- response bodies

def index_items(index: Index) -> dict[str, list]:
    """Every format's content as keywords, relations and facts (kf's keywords carry facts)."""
    keywords = list(index.keywords) + [k for k, _ in index.keyword_facts]
    facts = list(index.facts) + [f"{k}: {f}" for k, fs in index.keyword_facts for f in fs]
    return {"keywords": keywords, "relations": [list(r) for r in index.relations], "facts": facts}


def index_delta(prev: Optional[Index], cur: Index) -> dict[str, Any]:
    """What a step added to and removed from the index (the streamed "index delta")."""
    before = index_items(prev) if prev is not None else {"keywords": [], "relations": [], "facts": []}
    after = index_items(cur)
    delta: dict[str, Any] = {}
    for key in ("keywords", "relations", "facts"):
        old, new = [json.dumps(x) for x in before[key]], [json.dumps(x) for x in after[key]]
        delta[f"added_{key}"] = [json.loads(x) for x in new if x not in set(old)]
        delta[f"removed_{key}"] = [json.loads(x) for x in old if x not in set(new)]
    delta["summary"] = cur.summary if cur.summary != (prev.summary if prev else "") else None
    return delta


def step_summary(trace: Trace, step: Step) -> dict[str, Any]:
    i = step.step - 1  # steps are numbered 1, 2, ... in trace order
    prev = trace.steps[i - 1].index if i > 0 else None
    return {"step": step.step, "query": step.query,
            "retrieved": [{"id": p.id, "title": p.title, "text": p.text, "score": round(p.score, 4)}
                          for p in step.retrieved],
            "index": asdict(step.index), "index_text": get_format(step.index.format).linearize(step.index),
            "index_delta": index_delta(prev, step.index), "reasoning": step.reasoning,
            "judgment": step.judgment, "next_query": step.next_query, "fallbacks": step.fallbacks,
            "usage": {"prompt_tokens": step.prompt_tokens, "completion_tokens": step.completion_tokens},
            "wall_time_s": round(step.wall_time_s, 4)}


def answer_body(trace: Trace, settings: Settings, latency_s: float, with_trace: bool) -> dict[str, Any]:
    index = trace.final_index or empty_index(settings.index_format)
    u = trace.usage
    body = {"id": trace.question.id, "question": trace.question.question, "answer": trace.answer,
            "index": asdict(index), "index_text": get_format(index.format).linearize(index),
            "steps": [step_summary(trace, s) for s in trace.steps], "stop_reason": trace.stop_reason,
            "settings": asdict(settings),
            "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens},
            "latency_s": round(latency_s, 4)}
    if with_trace:
        body["trace"] = trace.to_dict()
    return body


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def corpus_size(retriever: Optional[Retriever]) -> Optional[int]:
    """The retriever's passage count, if it knows it (a remote one may not)."""
    if retriever is None:
        return None
    for attr in ("corpus_size", "num_passages", "size"):
        value = getattr(retriever, attr, None)
        if isinstance(value, int):
            return value
    for attr in ("passages", "corpus"):
        value = getattr(retriever, attr, None)
        if hasattr(value, "__len__"):
            return len(value)
    return len(retriever) if hasattr(retriever, "__len__") else None  # type: ignore[arg-type]


def versions() -> dict[str, Optional[str]]:
    out: dict[str, Optional[str]] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass  # not installed: leave it out rather than report a guess
    return out


def default_builder(cfg: ServeConfig) -> Builder:
    return lambda: (build_llm(cfg.llm), build_retriever(cfg.retriever))


# ---------------------------------------------------------------- the app

def create_app(cfg: ServeConfig, *, api_key: Optional[str] = None, build: Optional[Builder] = None) -> FastAPI:
    """The ASGI app. `build` loads (llm, retriever); by default from `cfg` via the registries.
    With `api_key`, every /v1 route needs `Authorization: Bearer <key>`; / and /healthz stay open,
    but /healthz shows its details (model, adapter, load error) only to a request with the key."""
    service = Service(cfg=cfg, build=build or default_builder(cfg))

    bridges: dict[asyncio.AbstractEventLoop, EventBridge] = {}

    def bridge() -> EventBridge:
        # One per event loop (uvicorn runs one; a test client may run the app on another).
        aloop = asyncio.get_running_loop()
        if aloop not in bridges:
            bridges[aloop] = EventBridge(aloop)
        return bridges[aloop]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        threading.Thread(target=service.load, name="kair-load", daemon=True).start()
        yield
        service.close()

    app = FastAPI(title="kair serve", version=versions().get("kair") or "dev", lifespan=lifespan)
    app.state.service = service
    app.add_middleware(BodyLimit, max_bytes=cfg.server.max_body_bytes)

    def has_key(request: Request) -> bool:
        if not api_key:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())

    def authorize(request: Request) -> None:
        if not has_key(request):
            raise HTTPException(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                                headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RequestError)
    async def request_error(request: Request, e: RequestError) -> JSONResponse:
        return JSONResponse({"detail": e.detail}, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": "invalid request: " + describe_validation(e)}, status_code=422)

    @app.post("/v1/answer", dependencies=[Depends(authorize)])
    async def answer(req: AnswerRequest) -> JSONResponse:
        job = Job(service, req, bridge(), stream=False)
        try:
            while True:  # only "answer" ends a request; steps are streamed by the other route
                event = await job.next_event(job.remaining())
                if event is None:
                    raise job.timeout_error()
                kind, payload = event
                if kind == "answer":
                    body = job.result(payload)
                    log_request(job, payload, 200)
                    return JSONResponse(body)
        except RequestError as e:
            log.info("request %s failed: %d %s", job.question.id, e.status, e.detail)
            raise
        finally:
            job.ticket.cancel()  # a no-op once answered; frees the slot on timeout or disconnect

    @app.post("/v1/answer/stream", dependencies=[Depends(authorize)])
    async def answer_stream(req: AnswerRequest) -> StreamingResponse:
        job = Job(service, req, bridge(), stream=True)  # problems before the stream starts are plain HTTP errors
        keepalive = cfg.server.keepalive_s

        async def events() -> AsyncIterator[str]:
            try:
                yield sse("start", {"id": job.question.id, "question": job.question.question,
                                    "settings": asdict(job.settings)})
                while True:
                    if job.remaining() <= 0:
                        e = job.timeout_error()
                        yield sse("error", {"status": e.status, "detail": e.detail})
                        return
                    event = await job.next_event(min(keepalive, job.remaining()))
                    if event is None:
                        yield ": keepalive\n\n"
                        continue
                    kind, payload = event
                    if kind == "step":
                        yield sse("step", payload)
                        continue
                    try:
                        yield sse("answer", job.result(payload))
                        log_request(job, payload, 200)
                    except RequestError as e:
                        yield sse("error", {"status": e.status, "detail": e.detail})
                    return
            finally:
                job.ticket.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        status = service.status
        if status == "ready" and service.scheduler is not None and not service.scheduler.running:
            status = "stopped"
        code = 200 if status == "ready" else 503
        # Probes and the page ask without a key: they get the state word, which is all a probe
        # needs and names no file. The model, adapter path and load error (with its file paths)
        # are for key holders. Without --api-key the server is local and trusted (the CLI warns
        # when it binds beyond loopback without one), so everyone gets the details.
        if not has_key(request):
            return JSONResponse({"status": status}, status_code=code)
        body = {"status": status, "backend": cfg.llm.backend, "model": cfg.llm.model,
                "adapter": cfg.llm.adapter, "retriever": cfg.retriever.kind,
                "llm": getattr(service.llm, "name", None)}
        if service.error:
            body["error"] = service.error
        return JSONResponse(body, status_code=code)

    @app.get("/v1/info", dependencies=[Depends(authorize)])
    async def info() -> JSONResponse:
        return JSONResponse(info_body(service))

    @app.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        html = resources.files("kair_runtime.serve").joinpath("static", "index.html").read_text(encoding="utf-8")
        return HTMLResponse(html)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(status_code=204)

    return app


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


def describe_validation(e: RequestValidationError) -> str:
    """Pydantic's error list as one readable line: `question: Field required; top_k: ...`."""
    parts = []
    for err in e.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'decode error')})")
        elif err.get("type") == "string_unicode":  # pydantic's word for a field *name* with a lone surrogate
            parts.append("a field name is not valid Unicode text (a lone surrogate escape); send UTF-8 text")
        elif not loc:  # the body as a whole: missing, or not an object (a list, a string, form data)
            parts.append('the body must be a JSON object like {"question": "..."} sent with '
                         "Content-Type: application/json")
        elif err.get("type") == "extra_forbidden":
            parts.append(f"{'.'.join(loc)}: unknown field; valid fields: {', '.join(AnswerRequest.model_fields)}")
        else:
            parts.append(f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "the body does not match the schema"


def log_request(job: Job, trace: Trace, status: int) -> None:
    log.info("request %s: %d, %d steps (%s), %.2fs", job.question.id, status, len(trace.steps),
             trace.stop_reason, time.perf_counter() - job.started)
