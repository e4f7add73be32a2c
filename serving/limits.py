"""The server's limits: one frozen dataclass, validated once, shared by the batcher, the HTTP layer,
``GET /info`` and the Ray Serve deployment."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from elmo_core.errors import InputError


@dataclass(frozen=True)
class ServeLimits:
    """What one request, one model batch and the queue may hold.

    ``max_batch_tokens`` bounds a model batch's padded tokens (sentences x longest sentence, as
    ``elmo embed``'s ``--max-tokens-per-batch``); ``max_queue`` counts sentences waiting for the
    model (a request that does not fit gets 503); ``max_wait_ms`` is how long the oldest queued
    sentence may wait for others to join its batch.
    """

    max_batch_tokens: int = 4096
    max_wait_ms: float = 0.0  # on a CPU a batch runs ~100 ms+: requests arriving meanwhile batch anyway
    max_queue: int = 1024
    max_request_sentences: int = 256
    max_sentence_tokens: int = 256
    max_body_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "max_wait_ms":
                if not 0 <= value <= 60_000:
                    raise InputError(f"--max-wait-ms must be in [0, 60000], got {value}")
            elif not isinstance(value, int) or value <= 0:
                raise InputError(f"--{f.name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.max_sentence_tokens > self.max_batch_tokens:
            raise InputError(f"--max-sentence-tokens ({self.max_sentence_tokens}) must be at most "
                             f"--max-batch-tokens ({self.max_batch_tokens}) so one sentence fits a batch")
        if self.max_request_sentences > self.max_queue:
            raise InputError(f"--max-request-sentences ({self.max_request_sentences}) must be at most "
                             f"--max-queue ({self.max_queue}) so one request fits the queue")

    def as_dict(self) -> dict:
        return asdict(self)
