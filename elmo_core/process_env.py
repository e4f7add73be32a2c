"""The process's environment for the native libraries torch loads, settled before they load: the
first thing importing any package of the project does (each package's ``__init__`` imports
``elmo_core`` first, whose ``__init__`` calls ``settle`` and loads nothing else until asked), so
the library gets what the CLI gets whatever a user imports first. Standard library only.

- OpenMP's workers sleep when idle instead of spinning (``OMP_WAIT_POLICY=PASSIVE``) unless the
  user chose a wait policy: OpenMP reads it once, as torch loads it. On a shared machine spinning
  workers take the cores other processes (and the job's own readers and writers) need.
- oneDNN's and ideep's primitive caches are capped (read at their first use), so that a long job
  of many shapes keeps bounded memory.
A variable the user set is kept.
"""
from __future__ import annotations

import os

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
PRIMITIVE_CACHE_CAPACITY = "8"
CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def wait_passively(environ: "os._Environ[str] | dict[str, str] | None" = None) -> None:
    env = os.environ if environ is None else environ
    if not any(name in env for name in WAIT_VARIABLES):
        env["OMP_WAIT_POLICY"] = "PASSIVE"


def bound_primitive_caches(environ: "os._Environ[str] | dict[str, str] | None" = None) -> None:
    env = os.environ if environ is None else environ
    for name in CACHE_VARIABLES:
        env.setdefault(name, PRIMITIVE_CACHE_CAPACITY)


def settle() -> None:
    """Both, on this process's environment (see the module doc)."""
    wait_passively()
    bound_primitive_caches()
