"""Pure ASGI middleware (no BaseHTTPMiddleware: it would hide the client's disconnect from the
handlers): admission (a 503 before the body is read), the body-size limit, the API key
(``Authorization: Bearer KEY``, as OpenAI clients send it), and the access log + request metrics;
and the warning for a server reachable beyond this machine with no key."""
from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from typing import Any, Callable

import numpy as np
import orjson
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import Unavailable
from .limits import AccessOptions
from .metrics import ServeMetrics

access_log = logging.getLogger("elmo.serving.access")
CLIENT_CLOSED = 499  # nginx's code for "the client closed the connection before the answer"
CUT_STATUS = "elmo.cut_status"  # scope key: the status the connection answered below the app (a 408 at a deadline)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), status, headers,
                    media_type="application/json")


CHUNK_NUMBERS = 1 << 16  # the most numbers one call of orjson encodes in ``json_in_pieces`` (~10 ms)


def json_in_pieces(body: Any) -> bytes:
    """``orjson.dumps(body)``'s bytes, made by calls of at most ``CHUNK_NUMBERS`` numbers each: one
    call holds the GIL throughout (an answer of millions of numbers: most of a second), so the event
    loop, on another thread, runs between the calls. Dicts and lists are joined here, an array
    larger than a piece a row at a time."""
    if isinstance(body, dict):
        return b"{" + b",".join(orjson.dumps(k) + b":" + json_in_pieces(v) for k, v in body.items()) + b"}"
    if isinstance(body, list):
        return b"[" + b",".join(json_in_pieces(v) for v in body) + b"]"
    if isinstance(body, np.ndarray) and body.ndim > 1 and body.size > CHUNK_NUMBERS:
        return b"[" + b",".join(json_in_pieces(row) for row in body) + b"]"
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def error_response(status: int, kind: str, message: str, retry_after: int | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    """Every refusal's answer (the routes' and the middleware's): ``{"error": {"type", "message"}}``."""
    retry = {"retry-after": str(retry_after)} if retry_after is not None else {}
    return json_response({"error": {"type": kind, "message": message}}, status, {**retry, **(headers or {})})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, access: AccessOptions) -> str | None:
    """The warning for a server bound beyond loopback with no API key, else None."""
    if access.api_key or is_loopback(host):
        return None
    return (f"listening on {host} with no API key: anyone who can reach this port can use the model; "
            f"set --api-key (or ELMO_API_KEY), or bind 127.0.0.1 behind a proxy")


class Cors(CORSMiddleware):
    """Starlette's CORS, its refused preflight answered as every refusal is (``error_response``):
    a 400 whose JSON names what the origin may not do, where Starlette answers plain text."""

    def preflight_response(self, request_headers: Any) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        what = bytes(response.body).decode("utf-8", "replace").removeprefix("Disallowed CORS ")
        return error_response(400, "cors", f"this server's CORS settings refuse this request's {what} "
                              f"(elmo serve --cors-allow-origin names the origins it answers)")


class ApiKey:
    """401 (``WWW-Authenticate: Bearer``) for a request without ``Authorization: Bearer KEY``."""

    def __init__(self, app: ASGIApp, key: str, open_paths: frozenset[str], docs_prefix: str) -> None:
        self.app, self.open_paths, self.docs_prefix = app, open_paths, docs_prefix
        self.expected = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or scope["path"].startswith(self.docs_prefix):
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.strip().partition(b" ")
        # RFC 7235: the scheme is case-insensitive ("bearer KEY" is "Bearer KEY"); the key is compared exactly
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.lstrip(b" "), self.expected):
            return await self.app(scope, receive, send)
        what = "a wrong API key" if given else "no API key"
        await error_response(401, "unauthorized", f"{what}: send the header Authorization: Bearer KEY (the key the "
                             f"server was started with)", headers={"www-authenticate": "Bearer"})(scope, receive, send)


class Admission:
    """A request for the model refused before its body is read (no parsing under overload) where
    ``admit()`` raises QueueFull or NotReady: 503 with Retry-After."""

    def __init__(self, app: ASGIApp, admit: Callable[[], None], routes: frozenset[str]) -> None:
        self.app, self.admit, self.routes = app, admit, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.routes:
            try:
                self.admit()
            except Unavailable as e:  # the body is not read, so the connection cannot carry another request
                refusal = error_response(503, e.kind, str(e), e.retry_after, {"connection": "close"})
                return await refusal(scope, receive, send)
        await self.app(scope, receive, send)


class BodyLimit:
    """Reads a request's whole body before the app, refusing one over ``max_body_bytes`` (413), declared or
    streamed, and a compressed one (415)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"", b"identity"):
            return await error_response(415, "unsupported_encoding", f"Content-Encoding {encoding.decode('latin-1')}: "
                                        f"bodies are read as sent; send the JSON uncompressed",
                                        headers={"connection": "close"})(scope, receive, send)
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refused(int(declared))(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._refused(size)(scope, receive, send)
            if not message.get("more_body", False):
                break
        whole = iter([{"type": "http.request", "body": b"".join(chunks), "more_body": False}])

        async def replay() -> Message:  # the whole body, then the client's disconnect
            return next(whole, None) or await receive()

        await self.app(scope, replay, send)

    def _refused(self, size: int) -> Response:
        return error_response(413, "limit_exceeded", f"request body of {size} bytes or more is over max_body_bytes "
                              f"({self.max_bytes}): send fewer sentences per request", headers={"connection": "close"})


class AccessLog:
    """One log line and the request metrics per HTTP request: route, status, time."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics, routes: frozenset[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.monotonic(), CLIENT_CLOSED

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            status = 500 if status == CLIENT_CLOSED else status
            raise
        finally:
            status = scope.get(CUT_STATUS, status) if status == CLIENT_CLOSED else status
            route = scope["path"] if scope["path"] in self.routes else "other"
            self.metrics.observe_request(route, status, started)
            client = scope.get("client") or ("-", 0)
            access_log.info('%s:%s "%s %s" %d %.1fms', client[0], client[1], scope["method"], scope["path"],
                            status, (time.monotonic() - started) * 1000)
