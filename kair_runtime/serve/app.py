"""The HTTP API around the KAIR loop.

    app = create_app(load_serve_config("configs/serve/default.yaml"), api_key="secret")
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes:
    POST /v1/answer         {question, max_steps?, top_k?, index_format?, return_trace?}
                            -> {id, answer, index, steps, usage, latency_s, ...} (+ trace)
    POST /v1/answer/stream  the same request; server-sent events: start, step..., answer | error
    POST /v1/chat/completions  OpenAI's chat completions (plain or streamed) over the same loop:
                            the last user message is the question, the trace rides in `kair`
                            (openai_api.py says what each field means)
    GET  /v1/models         the served model, OpenAI's list shape
    GET  /metrics           Prometheus text format (metrics.py); needs the key where one is set,
                            unless server.open_metrics
    GET  /healthz           200 once the model, adapter and retriever are loaded; 503 before. With an
                            API key, only {status} unless the request carries the key
    GET  /v1/info           model, adapter, retriever, corpus size, formats, limits, versions
    GET  /                  the demo page (static/index.html)

The model loads on a background thread after startup, so /healthz can answer 503 "loading"
meanwhile. Every request goes to the `Scheduler`'s worker thread, which batches concurrent
requests into the loop's rounds; its callbacks cross back to the event loop with
`call_soon_threadsafe`. Errors: 401 bad or missing key, 404 a model this server does not serve
(chat), 422 invalid request, 502 the backend or retriever failed for this request, 503 not loaded /
busy / shutting down, 504 timed out, 413 a body over server.max_body_bytes (refused before it is
read whole). The OpenAI routes send them in OpenAI's error shape, the others as {"detail"}.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import asdict
from importlib import resources
from typing import Any, AsyncIterator, Optional

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from kair_runtime.serve import openai_api as oai
from kair_runtime.serve.bodies import AnswerRequest, RequestError, describe_validation, sse, versions
from kair_runtime.serve.body_limit import BodyLimit
from kair_runtime.serve.config import ServeConfig
from kair_runtime.serve.metrics import CONTENT_TYPE, RequestMetrics
from kair_runtime.serve.service import Builder, EventBridge, Job, Service, default_builder, info_body, log_request

log = logging.getLogger("kair.serve")

OPENAI_ROUTES = ("/v1/chat/completions", "/v1/models")


def error_response(path: str, status: int, detail: str, headers: Optional[dict[str, str]] = None) -> JSONResponse:
    """An error in the shape of the route's API: OpenAI's on the OpenAI routes, {"detail"} elsewhere."""
    body = oai.error_body(status, detail) if path in OPENAI_ROUTES else {"detail": detail}
    return JSONResponse(body, status_code=status, headers=headers)


async def job_events(job: Job, keepalive_s: float) -> AsyncIterator[tuple[str, Any]]:
    """One job's events until it ends: ("step", step dict) as steps finish, ("keepalive", None)
    after keepalive_s without one, then ("answer", response body) or ("error", RequestError)."""
    while True:
        if job.remaining() <= 0:
            yield "error", job.timeout_error()
            return
        event = await job.next_event(min(keepalive_s, job.remaining()))
        if event is None:
            yield "keepalive", None
            continue
        kind, payload = event
        if kind == "step":
            yield "step", payload
            continue
        try:
            body = job.result(payload)
        except RequestError as e:
            yield "error", e
            return
        log_request(job, payload, 200)
        yield "answer", body
        return


async def answered(job: Job) -> dict[str, Any]:
    """The response body of a plain (not streamed) request; its RequestError otherwise."""
    try:
        async for kind, payload in job_events(job, job.timeout_s):
            if kind == "answer":
                return payload
            if kind == "error":
                raise payload
        raise RuntimeError("a job ended without an answer or an error")
    except RequestError as e:
        log.info("request %s failed: %d %s", job.question.id, e.status, e.detail)
        raise
    finally:
        job.ticket.cancel()  # a no-op once answered; frees the slot on timeout or disconnect


def create_app(cfg: ServeConfig, *, api_key: Optional[str] = None, build: Optional[Builder] = None) -> FastAPI:
    """The ASGI app. `build` loads (llm, retriever); by default from `cfg` via the registries.
    With `api_key`, every /v1 route and /metrics (unless server.open_metrics) need
    `Authorization: Bearer <key>`; / and /healthz stay open, but /healthz shows its details
    (model, adapter, load error) only to a request with the key."""
    service = Service(cfg=cfg, build=build or default_builder(cfg))
    started = int(time.time())
    keepalive = cfg.server.keepalive_s

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
    app.add_middleware(BodyLimit, max_bytes=cfg.server.max_body_bytes, render=error_response)

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
        return error_response(request.url.path, e.status, e.detail)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_response(request.url.path, e.status_code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, e: RequestValidationError) -> JSONResponse:
        path = request.url.path
        if path == "/v1/chat/completions":
            detail = describe_validation(e, oai.ACCEPTED_FIELDS,
                                         '{"model": "...", "messages": [{"role": "user", "content": "..."}]}')
        else:
            detail = describe_validation(e)
        return error_response(path, 422, "invalid request: " + detail)

    @app.post("/v1/answer", dependencies=[Depends(authorize)])
    async def answer(req: AnswerRequest) -> JSONResponse:
        return JSONResponse(await answered(Job(service, req, bridge(), stream=False)))

    @app.post("/v1/answer/stream", dependencies=[Depends(authorize)])
    async def answer_stream(req: AnswerRequest) -> StreamingResponse:
        job = Job(service, req, bridge(), stream=True)  # problems before the stream starts are plain HTTP errors

        async def events() -> AsyncIterator[str]:
            try:
                yield sse("start", {"id": job.question.id, "question": job.question.question,
                                    "settings": asdict(job.settings)})
                async for kind, payload in job_events(job, keepalive):
                    if kind == "keepalive":
                        yield ": keepalive\n\n"
                    elif kind == "error":
                        yield sse("error", {"status": payload.status, "detail": payload.detail})
                    else:
                        yield sse(kind, payload)
            finally:
                job.ticket.cancel()

        return event_stream(events())

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(req: oai.ChatRequest) -> Response:  # type: ignore[valid-type]
        model = oai.served_model(cfg.llm)["id"]
        if not oai.accepts_model(cfg.llm, req.model):
            raise RequestError(404, f"the model {req.model!r} is not served here; this server answers as "
                                    f"{model!r} (GET /v1/models)")
        try:
            question, unused = oai.as_answer_request(req)
        except ValidationError as e:  # the question's text, checked as /v1/answer checks it
            raise RequestError(422, "invalid request: " + "; ".join(
                f"{'messages[-1].content' if x['loc'] == ('question',) else '.'.join(map(str, x['loc']))}: "
                f"{x['msg']}" for x in e.errors())) from None
        job = Job(service, question, bridge(), stream=req.stream)
        if not req.stream:
            return JSONResponse(oai.completion(await answered(job), model, unused))
        cid, created = f"chatcmpl-{job.question.id}", int(time.time())
        include_usage = req.stream_options is not None and req.stream_options.include_usage

        async def chunks() -> AsyncIterator[str]:
            try:
                yield oai.chunk(model, cid, created, {"role": "assistant", "content": ""},
                                kair={"event": "start", "id": job.question.id, "question": job.question.question,
                                      "settings": asdict(job.settings), "unused_messages": unused})
                async for kind, payload in job_events(job, keepalive):
                    if kind == "keepalive":
                        yield ": keepalive\n\n"
                    elif kind == "step":
                        yield oai.chunk(model, cid, created, {}, kair={"event": "step", "step": payload})
                    elif kind == "error":
                        yield oai.data_line(oai.error_body(payload.status, payload.detail))
                    else:
                        yield oai.chunk(model, cid, created, {"content": payload["answer"]},
                                        kair={"event": "answer", **oai.kair_field(payload, unused)})
                        yield oai.chunk(model, cid, created, {}, finish_reason="stop")
                        if include_usage:
                            yield oai.chunk(model, cid, created, None, usage_=oai.usage(payload))
                yield oai.DONE
            finally:
                job.ticket.cancel()

        return event_stream(chunks())

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models() -> JSONResponse:
        return JSONResponse(oai.models_body(cfg.llm, started))

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        if not cfg.server.open_metrics:
            authorize(request)
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

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

    # Outermost, so a 413 of the body limit and every error response are counted too.
    app.add_middleware(RequestMetrics, metrics=service.metrics, routes=[r.path for r in app.routes])
    return app


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
