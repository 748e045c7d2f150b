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
import logging
import threading
from contextlib import asynccontextmanager
from dataclasses import asdict
from importlib import resources
from typing import AsyncIterator, Optional

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from kair_runtime.serve.bodies import AnswerRequest, RequestError, describe_validation, sse, versions
from kair_runtime.serve.body_limit import BodyLimit
from kair_runtime.serve.config import ServeConfig
from kair_runtime.serve.service import Builder, EventBridge, Job, Service, default_builder, info_body, log_request

log = logging.getLogger("kair.serve")


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
