"""Process plumbing: the CPUs this process is given (cpus.py), oneDNN cache caps and thread counts (settings.py), a local Ray cluster that ends with its driver (ray_local.py).
May import: elmo_core (tests/test_layers.py)."""
from elmo_core.process_env import bound_primitive_caches, wait_passively

from .cpus import CpuBudget, cpu_budget, process_cpu_budget, threads_for
from .settings import check_threads, deterministic_algorithms, process_started, use_threads

__all__ = ["CpuBudget", "bound_primitive_caches", "check_threads", "cpu_budget", "deterministic_algorithms",
           "process_cpu_budget", "process_started", "threads_for", "use_threads", "wait_passively"]
