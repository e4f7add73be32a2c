"""The server's Prometheus metrics, in a registry of its own (one per app, so several servers can
live in one process, as the tests run them)."""
from __future__ import annotations

import time
from functools import partial
from typing import Any, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()  # no *_created series beside every counter and histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKENS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class ServeMetrics:
    """Requests by route and status, queue depth, batch sizes, queue wait, model time, tokens served."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        counter, gauge, histogram = (partial(kind, registry=r) for kind in (Counter, Gauge, Histogram))
        self.requests = counter("elmo_requests_total", "HTTP requests by route and status code", ["route", "status"])
        self.request_seconds = histogram("elmo_request_duration_seconds", "HTTP request time by route", ["route"],
                                         buckets=_SECONDS)
        self.queue_depth = gauge("elmo_queue_depth", "sentences waiting for the model")
        self.batch_sentences = histogram("elmo_batch_sentences", "sentences per model batch", buckets=_COUNTS)
        self.batch_tokens = histogram("elmo_batch_tokens", "padded tokens (sentences x longest) per model batch",
                                      buckets=_TOKENS)
        self.queue_wait = histogram("elmo_queue_wait_seconds", "time a sentence waited for its batch", buckets=_SECONDS)
        self.model_seconds = histogram("elmo_model_seconds", "model time per batch", buckets=_SECONDS)
        self.sentences = counter("elmo_sentences_total", "sentences embedded")
        self.tokens = counter("elmo_tokens_total", "tokens embedded (served)")
        self.cancelled_sentences = counter("elmo_cancelled_sentences_total",
                                           "queued sentences dropped because their client went away")
        self.open_connections = gauge("elmo_open_connections", "HTTP connections open")
        self.connections_cut = counter("elmo_connections_cut_total", "connections closed by a deadline (idle, headers, "
                                       "body) or cut at shutdown mid-upload", ["phase"])
        self.connections_refused = counter("elmo_connections_refused_total",
                                           "connections closed as accepted: over --max-connections")

    def observe_batch(self, batch: Sequence[Any], started: float, model_seconds: float) -> None:
        """``batch``: the batcher's items (``tokens``, ``enqueued``)."""
        lengths = [len(item.tokens) for item in batch]
        self.batch_sentences.observe(len(batch))
        self.batch_tokens.observe(len(batch) * max(lengths, default=0))
        for item in batch:
            self.queue_wait.observe(max(0.0, started - item.enqueued))
        self.model_seconds.observe(model_seconds)
        self.sentences.inc(len(batch))
        self.tokens.inc(sum(lengths))

    def observe_request(self, route: str, status: int, started: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.request_seconds.labels(route).observe(time.monotonic() - started)

    def render(self) -> bytes:
        return generate_latest(self.registry)
