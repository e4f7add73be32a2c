"""Run an iterator in a background thread, ``depth`` items ahead of its consumer (bounded memory).

The model runs in torch's own threads and releases the GIL; reading Parquet, splitting tokens and
computing character ids in this thread overlaps with it. Exceptions reach the consumer.
"""
from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
_DONE = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def prefetch(items: Iterable[T], depth: int = 4) -> Iterator[T]:
    """Yield ``items`` in order, produced by a daemon thread at most ``depth`` items ahead."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as e:  # handed to the consumer, which re-raises it
            put(_Failure(e))

    thread = threading.Thread(target=produce, name="elmo-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
