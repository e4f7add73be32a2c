"""What a server runs: the model (``SentencePredictor``), the batcher in front of it, and the
loading / warm-up / ready / closing life cycle (``ServingState``), shared by uvicorn and Ray Serve."""
from __future__ import annotations

import logging
import threading
from typing import Callable, Sequence

import numpy as np

from elmo_core.errors import InputError
from elmo_core.names import HUB_OUTPUTS, OUTPUT_MODES, POOLS
from elmo_core.vectors import VectorRequest
from inference import Embedder
from inference.model_run import ModelRun

from .batcher import DynamicBatcher
from .errors import NotReady, QueueFull
from .limits import ServeLimits
from .metrics import ServeMetrics

log = logging.getLogger("elmo.serving")

# What the warm-up runs before /ready says 200: a short and a long sentence, every output path.
_WARM_UP = [["The", "cat", "sat", "on", "the", "mat", "."], ["Warm"] * 40]


class SentencePredictor:
    """Loads the backend in ``__init__``; ``__call__(spec, sentences)`` is pure: each sentence's
    vectors as ``Embedder.embed_sentences`` gives them for it alone, (T_i, [L+1,] D), or ([L+1,] D)
    pooled (None if empty)."""

    def __init__(self, run: ModelRun, limits: ServeLimits = ServeLimits()) -> None:
        self.embedder = Embedder(run.open(), policy=limits.batch_policy)
        self.config, self.limits = self.embedder.config, limits

    def check(self, spec: VectorRequest) -> None:
        """InputError (a 422) for a spec this model cannot serve, before it is queued."""
        self.embedder.backend.check_request(spec)

    def __call__(self, spec: VectorRequest, sentences: list[Sequence[str]]) -> list[np.ndarray | None]:
        return self.embedder.vectors(sentences, spec, check_finite=False)  # each request's own: ``app.check_finite``

    def warm_up(self) -> list[int]:
        """Each shape of work the routes ask for once, where this model computes it (a mixed
        ONNX export computes its own mix only), and every static shape the batcher's batches may
        take (the CUDA graphs of each row count: ``Backend.warm_shapes``), which it returns."""
        for spec in (VectorRequest(), VectorRequest("all"), VectorRequest(pool="mean", normalize=True)):
            try:
                self.check(spec)
            except InputError:
                continue  # a request the routes will refuse with a 422: nothing to warm
            self(spec, _WARM_UP)
        most = min(self.limits.max_queue, self.limits.batch_tokens)  # sentences one batch may hold
        return self.embedder.backend.warm_shapes(most)

    def close(self) -> None:
        self.embedder.close()


class ServingState:
    """The model's life cycle in a server: ``start`` loads and warms it on a thread (the server
    answers /health meanwhile, and /ready 503), then starts the batcher and calls ``on_ready``; a
    load failure is kept in ``error`` and reported through ``on_failure``. ``predictor_class`` makes its
    predictor (a ``SentencePredictor``)."""

    predictor_class: type[SentencePredictor] = SentencePredictor

    def __init__(self, run: ModelRun, limits: ServeLimits, metrics: ServeMetrics | None = None) -> None:
        self.run = run.batched(limits.max_batch_tokens, None, None)  # the budget asked, where asked: what /info says
        self.limits = limits.on_run(self.run)  # the run's batch budget where none was asked
        self.metrics = metrics or ServeMetrics()
        self.predictor: SentencePredictor | None = None
        self.batcher: DynamicBatcher | None = None
        self.error: BaseException | None = None
        self.on_ready: Callable[[], None] = lambda: None
        self.on_failure: Callable[[BaseException], None] = lambda error: None
        self._ready = threading.Event()
        self._closing = self._started = False

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and not self._closing

    def start(self) -> None:
        """Load and warm up the model on a thread (once: a second call does nothing)."""
        if not self._started:
            self._started = True
            threading.Thread(target=self._load, name="elmo-model-loader", daemon=True).start()

    def _load(self) -> None:
        try:
            predictor = self.predictor_class(self.run, self.limits)
            predictor.warm_up()
        except Exception as e:  # reported to the server, which stops and shows it
            self.error = e
            log.error("loading %s failed: %s", self.run.model, e)
            self.on_failure(e)
            return
        if self._closing:  # stopped while loading
            predictor.close()
            return
        self.predictor = predictor
        self.batcher = DynamicBatcher(predictor, self.limits, self.metrics).start()
        self._ready.set()
        self.on_ready()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    def serving(self) -> tuple[SentencePredictor, DynamicBatcher]:
        """The predictor and batcher, or NotReady (a 503) while loading or closing."""
        if self._closing:
            raise NotReady("the server is shutting down")
        if self.predictor is None or self.batcher is None:
            raise NotReady("the model is still loading" if self.error is None else f"the model failed to load: "
                                                                                     f"{self.error}", retry_after=5)
        return self.predictor, self.batcher

    def admit(self) -> None:
        """NotReady or QueueFull when a request for the model cannot be taken now (the HTTP layer
        asks before reading the body; the batcher checks the request's own size when it queues)."""
        _, batcher = self.serving()
        if batcher.depth >= self.limits.max_queue:
            raise QueueFull(f"the queue is full ({batcher.depth} sentences, max_queue {self.limits.max_queue}): "
                            f"retry later")

    def drain(self) -> None:
        """The server takes no more connections: the queued sentences run without waiting for others."""
        if self.batcher is not None:
            self.batcher.drain()

    def close(self) -> None:
        """Finish the queued sentences, stop the batcher, release the model."""
        self._closing = True
        if self.batcher is not None:
            self.batcher.close()
        if self.predictor is not None:
            self.predictor.close()

    def info(self) -> dict:
        config = self.predictor.config if self.predictor else None
        return {
            "model": self.run.name, "path": self.run.model, "backend": self.run.backend, "device": self.run.device,
            "precision": self.run.precision, "run": self.run.to_dict(), "ready": self.ready,
            "dim": config.output_dim if config else None, "layers": config.n_output_layers if config else None,
            "max_characters_per_token": config.char_cnn.max_characters_per_token if config else None,
            "outputs": [*OUTPUT_MODES, "layer:N", *HUB_OUTPUTS], "pools": ["none", *POOLS],
            "limits": self.limits.as_dict(),
        }
