"""Process plumbing: the CPUs this process is given (cpus.py), oneDNN cache caps and thread counts (settings.py), a local Ray cluster that ends with its driver (ray_local.py).
May import: elmo_core (tests/test_layers.py)."""
from .cpus import CpuBudget, cpu_budget, process_cpu_budget, threads_for, wait_passively

wait_passively()  # before .settings imports elmo_core, which loads torch and its OpenMP runtime

from .settings import (bound_primitive_caches, check_threads, deterministic_algorithms, process_started,  # noqa: E402
                       use_threads)

bound_primitive_caches()  # before torch builds any oneDNN primitive (importing torch builds none)

__all__ = ["CpuBudget", "bound_primitive_caches", "check_threads", "cpu_budget", "deterministic_algorithms",
           "process_cpu_budget", "process_started", "threads_for", "use_threads", "wait_passively"]
