"""Host buffers that a job's output windows reuse, so that a window's vectors are written into
memory the process has touched before.

A fresh array of a window's size (hundreds of MB) is a fresh mapping: the kernel zeroes each of its
pages on first write, and where transparent huge pages are on (numpy asks for them) it may first
compact memory to find them, which stalls the writing thread for up to seconds. A ``BufferPool``
keeps the buffers of windows that were written out and hands the smallest that fits, and is at
most twice the size asked, to the next window. ``lease()`` gives one window's ``empty``
(``np.empty``'s signature) and ``release`` (called once nothing reads the window's arrays any
more: its last piece written); ``nbytes`` is what the lease holds, which a bound on memory counts.

Only a caller that knows when its arrays are no longer read may lease: arrays that escape (a
library caller's, a Spark task's batch) are plain ``np.empty``.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

HEADROOM = 16  # a new buffer is 1/16 larger than asked, so a next window a little larger fits it


class BufferPool:
    """At most ``keep`` free buffers, the largest kept."""

    def __init__(self, keep: int = 4) -> None:
        self.keep, self.free, self.lock = keep, [], threading.Lock()
        self.made = 0  # buffers allocated (a count the tests read)

    def lease(self) -> "Lease":
        return Lease(self)

    def _take(self, nbytes: int) -> np.ndarray:
        with self.lock:
            fits = [b for b in self.free if nbytes <= b.nbytes <= 2 * nbytes]
            if fits:
                buf = min(fits, key=lambda b: b.nbytes)
                self.free = [b for b in self.free if b is not buf]
                return buf
            self.made += 1
        return np.empty(nbytes + nbytes // HEADROOM, dtype=np.uint8)

    def _give(self, lease: "Lease") -> None:
        with self.lock:
            buffers, lease.buffers = lease.buffers, []  # a second release gives nothing
            self.free = sorted(self.free + buffers, key=lambda b: b.nbytes)[-self.keep:]


class Lease:
    """One window's buffers from ``pool``: taken by ``empty``, all given back by ``release``."""

    def __init__(self, pool: BufferPool) -> None:
        self.pool, self.buffers = pool, []

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """Like ``np.empty``: its values are whatever the buffer held."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buf = self.pool._take(nbytes)
        self.buffers.append(buf)
        return buf[:nbytes].view(dtype).reshape(shape)

    def release(self) -> None:
        """Every buffer back to the pool: nothing may read this lease's arrays after it."""
        self.pool._give(self)
