"""The environment torch's native libraries read once, when they start: ``settle()`` sets it, an
explicit, idempotent call that each package's ``__init__`` (every door: the CLI, ``import pipelines``,
``from inference.embedder import Embedder``, ``import training``, ``serving``, ``elmo_core``, and so the
modules a Ray or Spark worker loads) makes as its first statement, before any of its modules loads
torch; importing this module changes nothing. Standard library only.

Whatever project module is imported first, the settings hold when torch loads. A process that
imported torch before any of the project cannot have them (OpenMP read its wait policy when torch
loaded): ``settle()`` says so with a ``RuntimeWarning`` naming the fix, and still sets the variables
for the processes this one starts (tests/core/test_process_env.py).

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
- A heap that keeps what a batch frees for the next batch (``reuse_freed_memory``, glibc only):
  glibc's malloc gives a large freed block back to the kernel (each thread's arena shrinks, blocks
  over the dynamic mmap threshold are unmapped), so every batch faults and zeroes its tensors' pages
  again: on a 2-core VM ``clear_page_erms`` was 12-15 % of a job's samples (``perf``). One arena,
  a fixed mmap threshold of 32 MiB (blocks under it come from the heap) and a trim threshold of
  1 GiB keep the pages mapped and reused: the host-side benchmark model's `embed_sentences` 1.4x, the same
  peak memory. It is a setting of this process's malloc (``mallopt``), not of its environment:
  each process that imports the library makes it for itself. Torch's huge pages are then not
  asked for (measured slower beside a reused heap: its 2 MiB-aligned blocks and ``madvise`` per
  allocation). A user's own malloc settings (``GLIBC_TUNABLES`` naming ``glibc.malloc.*``, or a
  ``MALLOC_*`` variable) leave both as they were: no ``mallopt``, huge pages asked for.

A value already in the environment is left as it is.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
import warnings
from dataclasses import dataclass
from typing import MutableMapping

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
PRIMITIVE_CACHE_CAPACITY = "8"
CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
HUGE_PAGE_VARIABLE = "THP_MEM_ALLOC_ENABLE"
# glibc's mallopt options (malloc.h) and the values set: one arena, blocks under 32 MiB from the heap, 1 GiB kept
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
HEAP_SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 1 << 30))


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


def users_malloc(environ: MutableMapping[str, str]) -> bool:
    """Whether the user tuned glibc's malloc (a ``glibc.malloc.*`` tunable or a ``MALLOC_*`` variable)."""
    return "glibc.malloc." in environ.get("GLIBC_TUNABLES", "") or any(k.startswith("MALLOC_") for k in environ)


def reuse_freed_memory() -> bool:
    """This process's malloc keeps freed blocks mapped for the next batch (``HEAP_SETTINGS``);
    False where the C library is not glibc or refused a setting."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all([mallopt(option, value) == 1 for option, value in HEAP_SETTINGS])


@dataclass(frozen=True)
class Settled:
    """What ``settle()`` found: whether torch had loaded before it (its OpenMP then runs without the
    wait policy set here, unless the user set one before the process started), and whether this
    process's heap keeps freed memory (``reuse_freed_memory``)."""
    torch_loaded_first: bool
    user_wait_policy: bool
    heap_reused: bool = False


_SETTLED: list[Settled] = []

TORCH_FIRST = ("torch was imported before the elmo library, so OpenMP's idle threads spin between parallel "
               "regions (several times slower beside a busy process): import the library (e.g. pipelines) before "
               "torch, or set OMP_WAIT_POLICY=PASSIVE before Python starts")


def settle(environ: MutableMapping[str, str] | None = None) -> Settled:
    """Every setting above, in ``environ`` (default: this process's, settled once: later calls return
    the first call's record)."""
    if environ is None and _SETTLED:
        return _SETTLED[0]
    env = os.environ if environ is None else environ
    reused = environ is None and not users_malloc(env) and reuse_freed_memory()
    found = Settled("torch" in sys.modules, any(name in env for name in WAIT_VARIABLES), reused)
    wait_passively(env)
    bound_primitive_caches(env)
    if not reused:
        huge_page_allocations(env)
    if environ is None:
        _SETTLED.append(found)
        if found.torch_loaded_first and not found.user_wait_policy:
            warnings.warn(TORCH_FIRST, RuntimeWarning, stacklevel=2)
    return found
