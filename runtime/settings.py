"""Process settings the CPU backends need: the thread count
(``use_threads``: the count ``runtime.cpus`` gives, or the one a user gave), torch's
deterministic kernels for a block that must give the same bits run after run
(``deterministic_algorithms``), and denormals flushed to zero for a block (``flushing_denormals``).
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator

from elmo_core.bounds import is_int
from elmo_core.errors import SettingError

from .cpus import CpuBudget, threads_for

INTEROP_THREADS = 1
MAX_THREADS = 4096


def check_threads(threads: int | None) -> None:
    """A thread count a user gave: None or 0 (torch's choice), else 1..MAX_THREADS; SettingError otherwise."""
    if threads is not None and not (is_int(threads) and 0 <= threads <= MAX_THREADS):
        raise SettingError(f"`threads` must be an integer from 0 to {MAX_THREADS} (0 or absent: the default), got "
                           f"{threads!r}")


def use_threads(threads: int | None) -> CpuBudget:
    """Run torch's CPU kernels on ``threads`` threads (None or 0: the CPUs this process is given,
    ``runtime.cpus``); returns the count and its reason.

    Intra-op (torch's OpenMP pool): that count. Inter-op: one thread, set while torch still allows
    it (before its first parallel work): nothing here runs operators beside each other, and a second
    pool of spinning workers would compete with the first for the same CPUs."""
    check_threads(threads)
    return apply_threads(threads_for(threads))


def apply_threads(budget: CpuBudget) -> CpuBudget:
    """``use_threads`` for a count a run settled (``CpuBudget``, checked where it was made)."""
    import torch
    torch.set_num_threads(budget.count)
    if torch.get_num_interop_threads() != INTEROP_THREADS:
        with contextlib.suppress(RuntimeError):  # torch refuses once its inter-op pool has started: it keeps its size
            torch.set_num_interop_threads(INTEROP_THREADS)
    return budget


CUBLAS_WORKSPACE = ":4096:8"  # the cuBLAS workspace torch's deterministic mode asks for on CUDA


@contextlib.contextmanager
def deterministic_algorithms() -> Iterator[None]:
    """torch's deterministic kernels while the block runs; the previous mode after it.

    Without it, a CPU process with more than one thread accumulates an indexed gradient (the
    backward of ``x[index]`` with repeated indices, e.g. the char-CNN's output gathered back to every
    occurrence of a distinct token) with atomic adds in parallel, whose order follows the threads'
    timing: the same run then differs in its last bits, and training grows that into ~1e-7 after
    10 steps and ~1e-6 later. The deterministic kernels add in index order. An operator torch has
    no deterministic kernel for warns (``warn_only``) instead of failing the block. On CUDA it
    also needs cuBLAS's fixed workspace (``CUBLAS_WORKSPACE_CONFIG``, read when cuBLAS starts; a
    value already in the environment is kept)."""
    import torch
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@contextlib.contextmanager
def flushing_denormals() -> Iterator[None]:
    """The CPU flushes denormal floats to zero while the block runs; the previous mode after it.

    Saturated LSTM gates produce denormals (values below ~1.2e-38), on which CPU kernels run ~10x
    slower; flushing them is numerically immaterial for a biLM. The mode is the calling thread's
    floating-point state, so a library call (``training.train``, ``perplexity``) must not leave it
    set in its caller's process (a caller's own maths, e.g. a test's float generator, needs
    denormals)."""
    import torch
    before = bool((torch.tensor([1e-39], dtype=torch.float32) * 1.0).item() == 0.0)  # flushing already
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)


def process_started() -> float:
    """When this process started, on ``time.perf_counter()``'s clock (Linux: /proc/self/stat's start
    time; elsewhere: now). What a budget in wall time, like ``elmo train --max-minutes``, counts from."""
    now = time.perf_counter()
    try:
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return now
    age = uptime - int(stat[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: start time in clock ticks
    return now - min(max(age, 0.0), 3600.0 * 24)
