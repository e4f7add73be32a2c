"""The HTTP API (FastAPI): ``POST /embed``, ``POST /v1/embeddings`` (OpenAI's shape), ``GET /health``,
``/ready``, ``/info``, ``/metrics``. The one place where serving errors become status codes:

    422 malformed or wrongly typed input      {"error": {"type": "invalid_request", ...}}
    413 over a limit (named in the message)   {"error": {"type": "limit_exceeded", ...}}
    503 queue full / not ready, Retry-After   {"error": {"type": "queue_full" | "not_ready", ...}}
    500 anything unexpected (the server goes on)

``create_app(state)`` builds the app around a ``ServingState``; uvicorn (``serving.server``) and
Ray Serve (``serving.ray_serve``) run the same app.
"""
from __future__ import annotations

import asyncio
import base64
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Sequence

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from elmo_core.errors import InputError
from elmo_core.whitespace import split_tokens

from .errors import InvalidRequest, LimitExceeded, NotReady, QueueFull
from .limits import ServeLimits
from .metrics import CONTENT_TYPE
from .middleware import CLIENT_CLOSED, AccessLog, BodyLimit
from .schemas import EmbedRequest, OpenAIEmbeddingRequest
from .service import OutputSpec, ServingState

log = logging.getLogger("elmo.serving")
ROUTES = frozenset({"/embed", "/v1/embeddings", "/health", "/ready", "/info", "/metrics"})


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), status, headers,
                    media_type="application/json")


def error_response(status: int, kind: str, message: str, retry_after: int | None = None) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return json_response({"error": {"type": kind, "message": message}}, status, headers)


def encode(vectors: np.ndarray | None, encoding: str) -> Any:
    """One sentence's vectors as JSON: nested lists, or base64 of little-endian float32 (C order)."""
    if vectors is None or encoding == "float":
        return vectors
    return base64.b64encode(np.ascontiguousarray(vectors, dtype="<f4").tobytes()).decode("ascii")


def check_limits(sentences: Sequence[Sequence[str]], limits: ServeLimits, field: str) -> None:
    if len(sentences) > limits.max_request_sentences:
        raise LimitExceeded("max_request_sentences", f"'{field}' has {len(sentences)} entries, over "
                            f"max_request_sentences ({limits.max_request_sentences}): split the request")
    for i, s in enumerate(sentences):
        if len(s) > limits.max_sentence_tokens:
            raise LimitExceeded("max_sentence_tokens", f"'{field}[{i}]' has {len(s)} tokens, over "
                                f"max_sentence_tokens ({limits.max_sentence_tokens}): split the sentence")


async def unless_disconnected(request: Request, work: Awaitable[list]) -> list | None:
    """``work``'s result, or None (and ``work`` cancelled: its queued sentences leave the queue)
    when the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    parts = []
    for err in errors[:5]:
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.get("loc", ())).lstrip(".")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    if any(e.get("loc") == ("body",) and e.get("type") == "model_attributes_type" for e in errors):
        parts.append("send a JSON object with the header Content-Type: application/json")
    return "; ".join(parts) + (f" (and {len(errors) - 5} more)" if len(errors) > 5 else "")


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return error_response(422, "invalid_request", _validation_message(exc))

    @app.exception_handler(InputError)
    async def _input(request: Request, exc: InputError) -> Response:
        return error_response(422, "invalid_request", str(exc))

    @app.exception_handler(LimitExceeded)
    async def _limit(request: Request, exc: LimitExceeded) -> Response:
        return error_response(413, "limit_exceeded", str(exc))

    @app.exception_handler(QueueFull)
    async def _full(request: Request, exc: QueueFull) -> Response:
        return error_response(503, "queue_full", str(exc), exc.retry_after)

    @app.exception_handler(NotReady)
    async def _not_ready(request: Request, exc: NotReady) -> Response:
        return error_response(503, "not_ready", str(exc), exc.retry_after)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, kind, f"{request.method} {request.url.path}: {exc.detail}")

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, "internal_error", f"{type(exc).__name__}: {exc}")


def create_app(state: ServingState) -> FastAPI:
    """The app around ``state``; its lifespan loads the model (``state.start``) and closes it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start()
        yield
        await asyncio.to_thread(state.close)

    app = FastAPI(title="elmo-pipeline", summary="ELMo vectors over HTTP", lifespan=lifespan)
    app.state.serving = state
    _install_error_handlers(app)
    _install_routes(app, state)
    app.add_middleware(BodyLimit, max_bytes=state.limits.max_body_bytes)
    app.add_middleware(AccessLog, metrics=state.metrics, routes=ROUTES)  # outermost: sees every answer
    return app


def _install_routes(app: FastAPI, state: ServingState) -> None:
    limits = state.limits

    @app.post("/embed", summary="ELMo vectors of tokenized sentences or whitespace-split texts")
    async def embed(body: EmbedRequest, request: Request) -> Response:
        predictor, batcher = state.serving()
        sentences = body.token_lists()
        check_limits(sentences, limits, "sentences" if body.sentences is not None else "texts")
        spec = OutputSpec(body.output, None if body.mix is None else tuple(body.mix), body.gamma,
                          None if body.pool == "none" else body.pool, body.normalize)
        predictor.check(spec)
        results = await unless_disconnected(request, batcher.submit(spec, sentences))
        if results is None:
            return Response(status_code=CLIENT_CLOSED)
        return json_response({"embeddings": [encode(r, body.encoding) for r in results],
                              "dim": predictor.config.output_dim,
                              "usage": {"sentences": len(sentences), "tokens": sum(map(len, sentences))}})

    @app.post("/v1/embeddings", summary="OpenAI-compatible: the mean-pooled mixed vector of each input, unit length")
    async def openai_embeddings(body: OpenAIEmbeddingRequest, request: Request) -> Response:
        predictor, batcher = state.serving()
        texts = body.texts()
        tokens = [split_tokens(t) for t in texts]
        check_limits(tokens, limits, "input")
        if empty := [i for i, t in enumerate(tokens) if not t]:
            raise InvalidRequest(f"input[{empty[0]}] has no tokens: every input must have some text")
        dim = predictor.config.output_dim
        if body.dimensions is not None and body.dimensions != dim:
            raise InvalidRequest(f"dimensions: this model's vectors have {dim}, got {body.dimensions}")
        results = await unless_disconnected(request, batcher.submit(OutputSpec(pool="mean", normalize=body.normalize), tokens))
        if results is None:
            return Response(status_code=CLIENT_CLOSED)
        n = sum(map(len, tokens))
        data = [{"object": "embedding", "index": i, "embedding": encode(r, body.encoding_format)}
                for i, r in enumerate(results)]
        return json_response({"object": "list", "data": data, "model": body.model or state.source.name,
                              "usage": {"prompt_tokens": n, "total_tokens": n}})

    @app.get("/health", summary="alive")
    async def health() -> Response:
        return json_response({"status": "alive"})

    @app.get("/ready", summary="200 once the model is loaded and warmed up, else 503")
    async def ready() -> Response:
        if state.ready:
            return json_response({"status": "ready"})
        if state.error is not None:
            return error_response(503, "not_ready", f"the model failed to load: {state.error}")
        return error_response(503, "not_ready", "the model is loading", retry_after=1)

    @app.get("/info", summary="model, dimensions, layers, backend, device, limits")
    async def info() -> Response:
        return json_response(state.info())

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)
