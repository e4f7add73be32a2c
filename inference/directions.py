"""The biLM's two directions at once on a CPU, each on its own thread with half the run's threads.

The forward and the backward LSTM of a layer share nothing until their outputs are mixed. A step
of one direction is two products and a few element-wise kernels of a fraction of a millisecond
each (full size, bf16 on AMX: a 104 x 512 by 512 x 16,384 product), and an OpenMP team of two
threads splits each of them: its worker sleeps between them (``OMP_WAIT_POLICY=PASSIVE``,
``elmo_core.process_env``) and is woken for every one, which costs as much as the work. Run as
two threads of one OpenMP thread each (torch releases the GIL inside its kernels), the directions
meet once a layer, or once a window of the ``rows`` layout. Measured on 2 cores of an AMX Xeon
(``bench/bench_directions.py``, docs/performance.md), the recurrence's median turn against one
team: quiet 1.00-1.63x, beside a process that keeps one core busy 1.12-1.33x; none slower. A small
model's steps (plain batched products, below ``fast_lstm.PACKED_MIN_WEIGHTS``) are the smallest
kernels, where one team's wake-ups cost most (a 2-core Zen 5: a 180 x 8 by 8 x 512 product 335 us on
a team of two, 37 us on one thread); ``Embedder.embed_sentences`` on 2 threads, one team against
threads of their own: the shipped model's ``packed`` layout 21.1k -> 27.7k tokens/s, a 512 x 32
one 78k -> 105-138k.

``split(threads)`` says when: an even count of two or more (each direction the same share, so a
kernel compiled for one share serves both).
"""
from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future, wait
from typing import Callable

import torch


def split(threads: int) -> bool:
    """Whether a CPU run on ``threads`` runs its directions on two threads of half as many each."""
    return threads >= 2 and threads % 2 == 0


class DirectionThreads:
    """Two threads that run ``fn(0)`` and ``fn(1)`` at once, each on half the caller's torch threads
    and in the caller's inference mode (thread-local in torch). Made on first use, and again in a
    process forked after it (a fork keeps no threads). Daemon threads: idle between runs, they never
    keep a process alive (the CLI joins every other thread before it exits), and ``run`` returns
    only once both are done."""

    def __init__(self) -> None:
        self._inboxes: list[queue.SimpleQueue] = []
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
        if not self._inboxes or self._pid != os.getpid():
            self._inboxes, self._pid = [_start_worker(f"elmo-direction_{d}") for d in (0, 1)], os.getpid()
        futures: list[Future] = [Future() for _ in (0, 1)]
        for d, inbox in enumerate(self._inboxes):
            inbox.put((task, d, futures[d]))
        wait(futures)  # both: where one fails, the other still writes into the shared buffers
        if changed:  # torch also keeps the count as the one a thread takes when it first runs: the caller's again
            torch.set_num_threads(threads)
        for f in futures:
            f.result()


def _start_worker(name: str) -> queue.SimpleQueue:
    """A daemon thread that runs each ``(fn, arg, future)`` put in the queue returned, in turn."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def work() -> None:
        while True:
            fn, arg, future = inbox.get()
            try:
                future.set_result(fn(arg))
            except BaseException as e:  # handed to the caller, which raises it
                future.set_exception(e)
    threading.Thread(target=work, name=name, daemon=True).start()
    return inbox
