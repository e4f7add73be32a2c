"""Dynamic batching across requests: the sentences of concurrent requests queue as separate items,
pooled into model batches under a padded-token budget and run by one model thread.

The cross-request policy only: which spec goes next (the oldest sentence's), when a batch starts
(full, or its oldest sentence waited ``max_wait_ms``; at once after ``drain``), the queue's bound
and cancellation (a cancelled request leaves the queue at once). Which sentences share a batch is
the engine's rule (``inference.batching.nearest_batch``); backends are stateless here, so batch-mates
change no vector. The model thread reaches the event loop only through ``call_soon_threadsafe``.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

from inference.batching import nearest_batch

from .errors import NotReady, QueueFull
from .limits import ServeLimits
from .metrics import ServeMetrics

# (spec, sentences) -> one result per sentence, in order; ``spec`` is the requests' output spec.
RunBatch = Callable[[Hashable, list[Sequence[str]]], Sequence[Any]]


@dataclass(eq=False)
class _Ticket:
    """One request: where its results go and how many are still missing."""

    future: asyncio.Future
    results: list
    remaining: int
    cancelled: bool = False


@dataclass(eq=False)
class _Item:
    tokens: Sequence[str]
    spec: Hashable
    ticket: _Ticket
    index: int
    enqueued: float = field(default_factory=time.monotonic)


def _resolve(future: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _deliver(ticket: _Ticket, value: Any, error: BaseException | None) -> None:
    try:
        ticket.future.get_loop().call_soon_threadsafe(_resolve, ticket.future, value, error)
    except RuntimeError:  # its event loop is closed: nobody waits for this request any more
        pass


class DynamicBatcher:
    """Queues sentences from any event loop and runs them through ``run_batch`` on one thread."""

    def __init__(self, run_batch: RunBatch, limits: ServeLimits, metrics: ServeMetrics | None = None) -> None:
        self._run_batch, self.limits, self.metrics = run_batch, limits, metrics or ServeMetrics()
        self._queue: list[_Item] = []
        self._cond = threading.Condition()
        self._closing = self._draining = False
        self._thread = threading.Thread(target=self._loop, name="elmo-batcher", daemon=True)

    def start(self) -> "DynamicBatcher":
        self._thread.start()
        return self

    def drain(self) -> None:
        """No new request will come (the server is stopping): queued sentences run now, without
        waiting for others to join; the requests already in flight may still queue theirs."""
        with self._cond:
            self._draining = True
            self._cond.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Stop taking requests, finish the queued ones, and stop the model thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def depth(self) -> int:
        """Sentences waiting for the model."""
        return len(self._queue)

    async def submit(self, spec: Hashable, sentences: Sequence[Sequence[str]]) -> list:
        """The results of ``run_batch`` for each sentence, in order. Raises QueueFull when the
        queue has no room for all of them (nothing is queued then), NotReady once closing."""
        if not sentences:
            return []
        ticket = _Ticket(asyncio.get_running_loop().create_future(), [None] * len(sentences), len(sentences))
        with self._cond:
            if self._closing:
                raise NotReady("the server is shutting down")
            if len(self._queue) + len(sentences) > self.limits.max_queue:
                raise QueueFull(f"the queue holds {len(self._queue)} sentences (max_queue "
                                f"{self.limits.max_queue}); this request has {len(sentences)}: retry later")
            now = time.monotonic()
            self._queue.extend(_Item(s, spec, ticket, i, now) for i, s in enumerate(sentences))
            self._depth_changed()
            self._cond.notify()
        try:
            return await ticket.future
        except asyncio.CancelledError:
            self._cancel(ticket)
            raise

    def _cancel(self, ticket: _Ticket) -> None:
        with self._cond:
            ticket.cancelled = True
            kept = [item for item in self._queue if item.ticket is not ticket]
            dropped = len(self._queue) - len(kept)
            self._queue = kept
            self._depth_changed()
        self.metrics.cancelled_sentences.inc(dropped)

    def _depth_changed(self) -> None:
        self.metrics.queue_depth.set(len(self._queue))

    def _select(self) -> tuple[list[int], bool]:
        """Queue positions of the next batch and whether it is full: the oldest sentence and the
        queued ones of its spec that the engine's rule (``inference.batching.nearest_batch``) puts
        with it under the token budget."""
        same = [p for p in range(len(self._queue)) if self._queue[p].spec == self._queue[0].spec]  # [0, ...]
        chosen, full = nearest_batch([len(self._queue[p].tokens) for p in same], self.limits.batch_policy)
        return [same[k] for k in chosen], full

    def _next_batch(self) -> list[_Item] | None:
        """Blocks until a batch is due; None once closing with nothing queued."""
        max_wait = self.limits.max_wait_ms / 1000
        with self._cond:
            while True:
                if not self._queue:
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                chosen, full = self._select()
                wait = self._queue[0].enqueued + max_wait - time.monotonic()
                if full or wait <= 0 or self._closing or self._draining:
                    taken = set(chosen)
                    batch = [self._queue[p] for p in chosen]
                    self._queue = [item for p, item in enumerate(self._queue) if p not in taken]
                    self._depth_changed()
                    return batch
                self._cond.wait(wait)

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            self._run(batch)

    def _run(self, batch: list[_Item]) -> None:
        start = time.monotonic()
        results: Sequence[Any] = ()
        error: BaseException | None = None
        try:
            results = self._run_batch(batch[0].spec, [item.tokens for item in batch])
        except Exception as e:  # delivered to each waiting request (a 500); the thread goes on
            error = e
        self.metrics.observe_batch(batch, start, time.monotonic() - start)
        for k, item in enumerate(batch):
            ticket = item.ticket
            if ticket.cancelled:
                continue
            if error is None:
                ticket.results[item.index] = results[k]
                ticket.remaining -= 1
            if error is not None or ticket.remaining == 0:
                _deliver(ticket, ticket.results, error)
