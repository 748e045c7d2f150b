"""`kair serve`: the KAIR loop behind an HTTP API, with continuous batching and a live demo page.

    app.py        the FastAPI app: /v1/answer, /v1/answer/stream (SSE), /v1/chat/completions,
                  /v1/models, /metrics, /healthz, /v1/info, /
    service.py    the service behind the routes: loading, request limits, one request's job
    bodies.py     the request model and the JSON bodies and SSE events the routes send
    openai_api.py OpenAI's chat-completions request, response, chunk and error shapes
    metrics.py    the Prometheus metrics and the middleware that counts requests
    scheduler.py  the worker thread that batches concurrent requests into loop rounds
    body_limit.py the ASGI middleware that refuses request bodies over server.max_body_bytes
    config.py     ServeConfig: a runtime config plus a `server` section
    cli.py        the `serve` command (mounted on the main `kair` app)
    static/       the single demo page

FastAPI, uvicorn and prometheus_client are the `serve` extra: only modules in this package import them.
"""
