"""The HTTP API (FastAPI): ``POST /embed``, ``POST /v1/embeddings`` (OpenAI's shape),
``POST /tokenize``, ``GET /health``, ``/ready``, ``/info``, ``/metrics``, and ``/docs`` (Swagger UI
from the ``fastapi-offline`` package's files: no CDN). The one place where serving errors become
status codes:

    422 malformed, wrongly typed or non-UTF-8 input     {"error": {"type": "invalid_request", ...}}
    413 over a limit (named in the message)             {"error": {"type": "limit_exceeded", ...}}
    408 headers or body too slow (serving.server)       {"error": {"type": "request_timeout", ...}}
    401 no or a wrong API key (serving.middleware)      {"error": {"type": "unauthorized", ...}}
    503 queue full / not ready, Retry-After             {"error": {"type": "queue_full" | "not_ready", ...}}
    500 anything unexpected (the server goes on)

``create_app(state, access)`` builds the app around a ``ServingState``; uvicorn (``serving.server``)
and Ray Serve (``serving.ray_serve``) run the same app; orjson parses the bodies (``OrjsonRoute``).
"""
from __future__ import annotations

import asyncio
import base64
import importlib.util
import logging
import math
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from elmo_core import ElmoConfig
from elmo_core.errors import InputError
from elmo_core.whitespace import split_tokens, token_spans
from elmo_core.vectors import VectorRequest
from inference.outputs import non_finite_rows

from .errors import InvalidRequest, LimitExceeded, NotReady, Unavailable
from .limits import AccessOptions, ServeLimits
from .metrics import CONTENT_TYPE
from .middleware import CLIENT_CLOSED, AccessLog, Admission, ApiKey, BodyLimit, Cors, error_response, json_in_pieces, \
    json_response
from .schemas import EmbedRequest, OpenAIEmbeddingRequest, TokenizeRequest
from .service import ServingState

log = logging.getLogger("elmo.serving")
MODEL_ROUTES = frozenset({"/embed", "/v1/embeddings"})
# GET routes answer HEAD too (RFC 9110 9.3.2: the same status and headers, no body), as load balancers
# and probes ask
PROBE_METHODS = ["GET", "HEAD"]
ROUTES = MODEL_ROUTES | {"/tokenize", "/health", "/ready", "/info", "/metrics", "/docs", "/openapi.json"}
DOCS_STATIC = "/docs-static"


class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())  # orjson.JSONDecodeError is a json.JSONDecodeError
        return self._json


class OrjsonRoute(APIRoute):
    """A route whose JSON body orjson parses: strict UTF-8, no recursion limit to overflow, and
    integers beyond float64 refused; FastAPI turns its decode errors into 422s."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def orjson_handler(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive, request._send))

        return orjson_handler


async def answered(build: Callable[[], Any]) -> Response:
    """The vectors' answer, built and encoded to JSON on a thread, in pieces (``json_in_pieces``):
    the largest one an answer may hold (``--max-answer-values``, ~17M numbers at full size) takes
    about a second, during which the event loop would answer nothing (``/health`` either)."""
    body = await asyncio.to_thread(lambda: json_in_pieces(build()))
    return Response(body, media_type="application/json")


def encode(vectors: np.ndarray | None, encoding: str) -> Any:
    """One sentence's vectors as JSON: nested lists, or base64 of little-endian float32 (C order)."""
    if vectors is None or encoding == "float":
        return vectors
    return base64.b64encode(np.ascontiguousarray(vectors, dtype="<f4").tobytes()).decode("ascii")


def fit(sentences: Sequence[Sequence[str]], limits: ServeLimits, field: str,
        truncate: bool | None) -> tuple[list[Sequence[str]], int]:
    """The sentences within the limits and how many were cut: a sentence over max_sentence_tokens
    is cut to it when ``truncate`` (None: the server's ``auto_truncate``), else LimitExceeded."""
    if len(sentences) > limits.max_request_sentences:
        raise LimitExceeded(f"'{field}' has {len(sentences)} entries, over "
                            f"max_request_sentences ({limits.max_request_sentences}): split the request")
    cap, cut = limits.max_sentence_tokens, limits.auto_truncate if truncate is None else truncate
    for i, s in enumerate(sentences):
        if len(s) > cap and not cut:
            raise LimitExceeded(f"'{field}[{i}]' has {len(s)} tokens, over "
                                f"max_sentence_tokens ({cap}): split the sentence, or send \"truncate\": true")
    return [s[:cap] for s in sentences], sum(len(s) > cap for s in sentences)


def check_answer_size(sentences: Sequence[Sequence[str]], vectors: VectorRequest, config: ElmoConfig,
                      limits: ServeLimits) -> None:
    """The answer's numbers within ``max_answer_values`` (LimitExceeded otherwise), counted before
    any is computed: a token's vectors each (a sentence's, pooled), each [L+1 x] D wide."""
    width = math.prod(vectors.mode.shape(config.n_output_layers, config.output_dim))
    count = (len(sentences) if vectors.pool else sum(map(len, sentences))) * width
    if count > limits.max_answer_values:
        raise LimitExceeded(f"the answer would hold {count:,} numbers, over max_answer_values "
                            f"({limits.max_answer_values:,}): send fewer sentences, or ask one vector per sentence "
                            f"(\"pool\") or one layer (\"output\")")


def check_finite(results: Sequence[np.ndarray | None]) -> None:
    """The model's vectors are finite; only a huge ``gamma`` can scale them past float32."""
    if any(r is not None and non_finite_rows(r[None]).any() for r in results):
        raise InvalidRequest("gamma: the scaled vectors overflow float32; use a smaller gamma")


async def unless_disconnected(request: Request, work: Awaitable[list]) -> list | None:
    """``work``'s result, or None (``work`` cancelled: its sentences leave the queue) once the client disconnects;
    NotReady (``work`` cancelled too) once the server's shutdown deadline cuts the request."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # uvicorn's, at the shutdown deadline: answered here, not with its plain 500
        asyncio.current_task().uncancel()  # handled: the answer is still sent
        if task.done() and not task.cancelled():
            return task.result()  # done in time: its vectors, not a refusal
        task.cancel()
        await asyncio.wait({task})  # its sentences out of the queue before the answer
        raise NotReady("the server is shutting down and its deadline (--shutdown-timeout-s) passed before this "
                       "request's vectors were ready: retry elsewhere") from None
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
        if err.get("type") == "json_invalid":
            why = str(err.get("ctx", {}).get("error"))
            what = "begins with a byte-order mark" if "BOM" in why else \
                "not UTF-8 text (bytes of another encoding, or a lone surrogate)" if "UTF-8" in why else \
                f"not valid JSON at character {err['loc'][-1]} ({why})"
            parts.append(f"body: {what}: send UTF-8 JSON" + (" without it" if "BOM" in why else ""))
            continue
        if err.get("type") == "missing" and tuple(err.get("loc", ())) == ("body",):
            parts.append("the request has no body: send a JSON object (with its Content-Length, or chunked)")
            continue
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.get("loc", ())).lstrip(".")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    if any(e.get("loc") == ("body",) and e.get("type") == "model_attributes_type" for e in errors):
        parts.append("send a JSON object with the header Content-Type: application/json")
    return "; ".join(parts) + (f" (and {len(errors) - 5} more)" if len(errors) > 5 else "")


def _answer(status: int, kind: str | None = None) -> Callable[[Request, Exception], Awaitable[Response]]:
    """The handler of a typed error: ``status``, ``kind`` (None: an Unavailable's own), its Retry-After."""

    async def handle(request: Request, exc: Exception) -> Response:
        return error_response(status, kind or exc.kind, str(exc), getattr(exc, "retry_after", None))

    return handle


def _install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(InputError, _answer(422, "invalid_request"))
    app.add_exception_handler(LimitExceeded, _answer(413, "limit_exceeded"))
    app.add_exception_handler(Unavailable, _answer(503))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return error_response(422, "invalid_request", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, kind, f"{request.method} {request.url.path}: {exc.detail}",
                              headers=exc.headers)  # a 405's Allow

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, "internal_error", f"{type(exc).__name__}: {exc}")


def create_app(state: ServingState, access: AccessOptions = AccessOptions()) -> FastAPI:
    """The app around ``state``; its lifespan loads the model (``state.start``) and closes it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start()
        yield
        await asyncio.to_thread(state.close)

    app = FastAPI(title="elmo-pipeline", summary="ELMo vectors over HTTP", lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.router.route_class = OrjsonRoute
    _install_error_handlers(app)
    _install_routes(app, state)
    _install_docs(app)
    # Added innermost first: AccessLog sees every answer, CORS answers preflights before the key check.
    app.add_middleware(BodyLimit, max_bytes=state.limits.max_body_bytes)
    app.add_middleware(Admission, admit=state.admit, routes=MODEL_ROUTES)
    if access.api_key:
        app.add_middleware(ApiKey, key=access.api_key, open_paths=access.open_paths(), docs_prefix=DOCS_STATIC)
    if access.cors_origins:
        app.add_middleware(Cors, allow_origins=list(access.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["authorization", "content-type"], max_age=600)
    app.add_middleware(AccessLog, metrics=state.metrics, routes=ROUTES)
    return app


def _install_docs(app: FastAPI) -> None:
    """Swagger UI at /docs from the files of the ``fastapi-offline`` package (works offline)."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        return  # /openapi.json still answers
    app.mount(DOCS_STATIC, StaticFiles(directory=Path(spec.origin).parent / "static"), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> Response:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(openapi_url=f"{root}{app.openapi_url}", title="elmo-pipeline API",
                                   swagger_js_url=f"{root}{DOCS_STATIC}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{DOCS_STATIC}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{DOCS_STATIC}/favicon.png")


def _install_routes(app: FastAPI, state: ServingState) -> None:
    """The vector and token routes, then the probes."""
    limits = state.limits

    @app.post("/embed", summary="ELMo vectors of tokenized sentences or whitespace-split texts")
    async def embed(body: EmbedRequest, request: Request) -> Response:
        predictor, batcher = state.serving()
        field = "sentences" if body.sentences is not None else "texts"
        sentences, cut = fit(body.token_lists(), limits, field, body.truncate)
        predictor.check(body.vectors)
        check_answer_size(sentences, body.vectors, predictor.config, limits)
        results = await unless_disconnected(request, batcher.submit(body.vectors, sentences))
        if results is None:
            return Response(status_code=CLIENT_CLOSED)
        check_finite(results)
        usage = {"sentences": len(sentences), "tokens": sum(map(len, sentences)), "truncated": cut}
        return await answered(lambda: {"embeddings": [encode(r, body.encoding) for r in results],
                                       "dim": predictor.config.output_dim, "usage": usage})

    @app.post("/v1/embeddings", summary="OpenAI-compatible: the mean-pooled mixed vector of each input, unit length")
    async def openai_embeddings(body: OpenAIEmbeddingRequest, request: Request) -> Response:
        predictor, batcher = state.serving()
        tokens, cut = fit([split_tokens(t) for t in body.texts()], limits, "input", body.truncate)
        if empty := [i for i, t in enumerate(tokens) if not t]:
            raise InvalidRequest(f"input[{empty[0]}] has no tokens: every input must have some text")
        dim = predictor.config.output_dim
        if body.dimensions is not None and body.dimensions != dim:
            raise InvalidRequest(f"dimensions: this model's vectors have {dim}, got {body.dimensions}")
        results = await unless_disconnected(request, batcher.submit(VectorRequest(pool="mean", normalize=body.normalize), tokens))
        if results is None:
            return Response(status_code=CLIENT_CLOSED)
        n = sum(map(len, tokens))
        return await answered(lambda: {
            "object": "list", "model": body.model or state.run.name,
            "data": [{"object": "embedding", "index": i, "embedding": encode(r, body.encoding_format)}
                     for i, r in enumerate(results)],
            "usage": {"prompt_tokens": n, "total_tokens": n, "truncated": cut}})

    _install_tokenize(app, limits)
    _install_probes(app, state)


def _install_tokenize(app: FastAPI, limits: ServeLimits) -> None:
    """The route that answers what the model would see, without running it."""

    @app.post("/tokenize", summary="the tokens the model sees for each text, with their character offsets")
    async def tokenize(body: TokenizeRequest) -> Response:
        tokens, cut = fit([split_tokens(t) for t in body.texts], limits, "texts", body.truncate)  # refused at once
        offsets = [token_spans(text, len(t)) for text, t in zip(body.texts, tokens)]  # (what is kept only)
        return json_response({"tokens": tokens, "offsets": offsets,
                              "usage": {"texts": len(tokens), "tokens": sum(map(len, tokens)), "truncated": cut}})


def _install_probes(app: FastAPI, state: ServingState) -> None:
    """The routes a load balancer or a scraper asks: alive, ready, what is served, metrics."""

    @app.api_route("/health", methods=PROBE_METHODS, summary="alive")
    async def health() -> Response:
        return json_response({"status": "alive"})

    @app.api_route("/ready", methods=PROBE_METHODS, summary="200 once the model is loaded and warmed up, else 503")
    async def ready() -> Response:
        if state.ready:
            return json_response({"status": "ready"})
        if state.error is not None:
            return error_response(503, "not_ready", f"the model failed to load: {state.error}")
        return error_response(503, "not_ready", "the model is loading", retry_after=1)

    @app.api_route("/info", methods=PROBE_METHODS, summary="model, dimensions, layers, backend, device, limits")
    async def info() -> Response:
        return json_response(state.info())

    @app.api_route("/metrics", methods=PROBE_METHODS, summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)
