"""Process plumbing: the CPUs this process is given (cpus.py), thread counts and deterministic kernels (settings.py), a local Ray cluster that ends with its driver (ray_local.py).
May import: elmo_core (tests/test_layers.py)."""
# OpenMP's wait policy and oneDNN's cache caps are set by elmo_core's import (elmo_core/process_env.py).
from .cpus import CpuBudget, cpu_budget, process_cpu_budget, threads_for
from .settings import check_threads, deterministic_algorithms, flushing_denormals, process_started, use_threads

__all__ = ["CpuBudget", "check_threads", "cpu_budget", "deterministic_algorithms", "flushing_denormals", "process_cpu_budget",
           "process_started", "threads_for", "use_threads"]
