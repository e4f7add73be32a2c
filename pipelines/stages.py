"""Where a job's time goes: wall seconds per stage, summed over the windows, and the process's CPU
seconds, reported in the summary and the manifest so a user sees what bounds the job.

Stages: ``read`` (Parquet rows into windows), ``prepare`` (tokens, windows of long rows, length
buckets, character ids), ``model`` (the backend, including the copy of what is written to the
host), ``assemble`` (rows to their place, the Arrow column), ``write`` (Parquet encoding, the
file, commit checksums). ``read`` and ``prepare`` run in the prefetch thread beside the others,
so the stages overlap and their sum can exceed the job's wall time. On a GPU, ``model`` over the
wall time is the share of time the device had work (``device_busy``). ``cpu_seconds``: the CPU
time of the thread each stage ran on (a stage's wall time also holds its waits: for a core, the
disk, the GIL); the threads a stage hands work to (torch's, pyarrow's) count in the process's only.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

STAGES = ("read", "prepare", "model", "assemble", "write")


class StageClock:
    """Thread-safe wall-second totals per stage, and the writing's per writer (a writer thread writes
    whole shards, so a job of fewer shards than threads keeps some of them idle)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.cpu = dict.fromkeys(STAGES, 0.0)  # each stage's CPU seconds on the thread it ran on
        self.remote = False  # workers' totals added (``add``): their CPU seconds are not this process's
        self.writing: dict[str, float] = {}  # this process's writers by name: each one's encoding and commits
        self._lock = threading.Lock()
        self._cpu0 = time.process_time()

    @contextlib.contextmanager
    def stage(self, name: str, writer: str | None = None) -> Iterator[None]:
        """Time a stage; ``write`` counts on ``writer`` too (default: the calling thread's name; a
        writer's commit, in a thread of its own, names the writer whose shard it commits)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            dt, cpu = time.perf_counter() - t0, time.thread_time() - c0
            with self._lock:
                self.seconds[name] += dt
                self.cpu[name] += cpu
                if name == "write":
                    writer = writer or threading.current_thread().name
                    self.writing[writer] = self.writing.get(writer, 0.0) + dt

    def add(self, seconds: dict[str, float]) -> None:
        """Add another clock's totals (a Ray or Spark worker's: each writes the one shard it is given,
        so the workers' writing sums as their model time does)."""
        with self._lock:
            self.remote = True
            for k, v in seconds.items():
                self.seconds[k] += v

    def report(self, wall: float, device: str) -> dict:
        """The stages' seconds, their CPU seconds (where this process ran them), the process's CPU
        seconds, and ``bound_by``: the thread busiest over the job
        (``THREADS``: the prefetch thread reads and prepares, the main thread runs the model and
        assembles, writer threads write), the one that bounds it. The writing's is its busiest
        writer's seconds (``writers``) where this process wrote; where workers did (``add``), their total."""
        out = {"seconds": {k: round(v, 3) for k, v in self.seconds.items()},
               "process_cpu_seconds": round(time.process_time() - self._cpu0, 3), "wall_seconds": round(wall, 3)}
        if not self.remote:
            out["cpu_seconds"] = {k: round(v, 3) for k, v in self.cpu.items()}
        if device != "cpu" and wall > 0:
            out["device_busy"] = round(min(1.0, self.seconds["model"] / wall), 3)
        busy = {name: sum(self.seconds[k] for k in stages) for name, stages in THREADS.items()}
        if self.writing:
            out["writers"] = {k: round(v, 3) for k, v in sorted(self.writing.items())}
            busy["write"] = max(self.writing.values())
        out["bound_by"] = max(busy, key=busy.__getitem__)
        return out


THREADS = {"read": ("read", "prepare"), "model": ("model", "assemble"), "write": ("write",)}  # a job's threads

