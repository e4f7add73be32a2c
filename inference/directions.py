"""The biLM's two directions at once on a CPU, each on its own thread with half the run's threads.

The forward and the backward LSTM of a layer share nothing until their outputs are mixed. A step
of one direction is two products and a few element-wise kernels of a fraction of a millisecond
each (full size, bf16 on AMX: a 104 x 512 by 512 x 16,384 product), and an OpenMP team of two
threads splits each of them: its worker sleeps between them (``OMP_WAIT_POLICY=PASSIVE``,
``elmo_core.process_env``) and is woken for every one, which costs as much as the work. Run as
two threads of one OpenMP thread each (torch releases the GIL inside its kernels), the directions
meet once a layer, or once a window of the ``rows`` layout. Measured on 2 cores of an AMX Xeon
(``bench/bench_directions.py``, docs/performance.md), the recurrence's median turn against one
team: quiet 1.00-1.63x, beside a process that keeps one core busy 1.12-1.33x; none slower.

``split(threads)`` says when: an even count of two or more (each direction the same share, so a
kernel compiled for one share serves both).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable

import torch


def split(threads: int) -> bool:
    """Whether a CPU run on ``threads`` runs its directions on two threads of half as many each."""
    return threads >= 2 and threads % 2 == 0


class DirectionThreads:
    """Two threads that run ``fn(0)`` and ``fn(1)`` at once, each on half the caller's torch threads
    and in the caller's inference mode (thread-local in torch). Made on first use, and again in a
    process forked after it (a fork keeps no threads)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0

    def run(self, fn: Callable[[int], None]) -> None:
        """``fn`` of each direction, both finished when this returns (the first error raised)."""
        threads, inference = torch.get_num_threads(), torch.is_inference_mode_enabled()
        share, changed = max(1, threads // 2), []

        def task(d: int) -> None:
            if torch.get_num_threads() != share:  # this thread's own count, set on its first run
                torch.set_num_threads(share)
                changed.append(d)
            with torch.inference_mode(inference):
                fn(d)
        if self._pool is None or self._pid != os.getpid():
            self._pool, self._pid = ThreadPoolExecutor(2, thread_name_prefix="elmo-direction"), os.getpid()
        futures = [self._pool.submit(task, d) for d in (0, 1)]
        wait(futures)  # both: where one fails, the other still writes into the shared buffers
        if changed:  # torch also keeps the count as the one a thread takes when it first runs: the caller's again
            torch.set_num_threads(threads)
        for f in futures:
            f.result()
