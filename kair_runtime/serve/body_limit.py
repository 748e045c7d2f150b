"""A bound on request bodies, enforced while they arrive rather than after they are buffered.

    app.add_middleware(BodyLimit, max_bytes=65536)

A declared Content-Length over the limit is refused before a byte of the body is read; a body
without one (chunked) is counted as it is received and refused at the first chunk past the
limit. Either way the answer is a 413 naming the limit, and the rest of the body is never read.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, MutableMapping, Optional

from fastapi import HTTPException
from fastapi.responses import JSONResponse, Response

Message = MutableMapping[str, Any]
# (path, status, detail, headers) -> the error response: each route family has its error shape.
Render = Callable[[str, int, str, Optional[dict[str, str]]], Response]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyTooLarge(HTTPException):
    # An HTTPException so that FastAPI passes it through its body parsing unchanged (any other
    # exception from reading the body becomes a generic 400) and the app's handler renders it.
    def __init__(self, max_bytes: int, declared: Optional[int] = None):
        size = f"{declared} bytes" if declared is not None else "the body"
        # Connection: close, since the unread rest of the body would otherwise be parsed as the
        # next request on a kept-alive connection.
        super().__init__(413, f"request body too large: {size} is over the limit of {max_bytes} bytes "
                              f"(server.max_body_bytes)", headers={"Connection": "close"})


class BodyLimit:
    """ASGI middleware: HTTP request bodies over `max_bytes` get a 413 before they are read whole."""

    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int, render: Optional[Render] = None):
        self.app, self.max_bytes = app, max_bytes
        self.render = render or (lambda path, status, detail, headers: JSONResponse(
            {"detail": detail}, status_code=status, headers=headers))

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self.reject(BodyTooLarge(self.max_bytes, declared), scope, receive, send)
            return

        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge as e:
            # A route normally turns it into its 413 itself; this covers a body read elsewhere.
            if started:
                raise
            await self.reject(e, scope, receive, send)

    async def reject(self, e: BodyTooLarge, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        response = self.render(scope.get("path", ""), e.status_code, e.detail, e.headers)
        await response(scope, receive, send)


def content_length(scope: MutableMapping[str, Any]) -> Optional[int]:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server rejects a malformed header; the byte count still applies
    return None

