"""Typed errors of the serving package; only the HTTP layer (``serving.app``) turns them into status codes."""
from __future__ import annotations

from elmo_core.errors import ElmoError, InputError


class LimitExceeded(ElmoError):
    """A request over one of the server's limits (its message names it, e.g. ``max_request_sentences``)."""


class Unavailable(ElmoError):
    """The server cannot take the request now; retry after ``retry_after`` s. ``kind``: the answer's type."""

    kind: str

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFull(Unavailable):
    """The batcher's queue has no room for the request's sentences."""

    kind = "queue_full"


class NotReady(Unavailable):
    """The model is still loading or warming up, or the server is shutting down."""

    kind = "not_ready"


class InvalidRequest(InputError):
    """A request whose content the schema accepts but the model cannot take (e.g. an empty input
    to the OpenAI route); 422, naming the field."""
