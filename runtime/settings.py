"""Process settings the CPU backends need: the oneDNN cache caps, applied once when ``runtime`` is
imported (``inference`` and ``training`` import it before any model runs), and the thread count.

oneDNN (under torch's convolutions and pre-packed GEMMs) caches one compiled primitive per input
shape: by default 1,024 in oneDNN's global cache plus 1,024 in each thread's ideep cache. The
char-CNN sees a new token count and the recurrence a new row count in nearly every batch, so a
long job fills those caches with primitives and their buffers: measured on the full-size model,
peak RSS rose ~110 MB per 1,000 input rows (1,926 MiB after 6,000 rows, 1,599 MiB with the caps
below), at no measured cost in speed. A value already in the environment is left as it is.
"""
from __future__ import annotations

import os

from elmo_core.errors import InputError

PRIMITIVE_CACHE_CAPACITY = "8"
_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_primitive_caches() -> None:
    """Cap oneDNN's and ideep's primitive caches (read at their first use, so call this early)."""
    for name in _CACHE_VARIABLES:
        os.environ.setdefault(name, PRIMITIVE_CACHE_CAPACITY)


MAX_THREADS = 4096


def check_threads(threads: int | None) -> None:
    """A thread count a user gave: None or 0 (torch's choice), else 1..MAX_THREADS; InputError otherwise."""
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool)
                                or not 0 <= threads <= MAX_THREADS):
        raise InputError(f"--threads must be a positive integer (at most {MAX_THREADS}; 0 or absent: the "
                         f"default), got {threads!r}")


def use_threads(threads: int | None) -> None:
    """Run torch's CPU kernels on ``threads`` threads (None or 0: leave torch's choice)."""
    check_threads(threads)
    if threads:
        import torch
        torch.set_num_threads(threads)
