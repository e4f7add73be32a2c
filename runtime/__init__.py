"""Process plumbing: the CPUs this process is given (cpus.py), thread counts and deterministic kernels (settings.py), a local Ray cluster that ends with its driver (ray_local.py), a job's reused output buffers (buffers.py).
May import: elmo_core, storage (tests/test_layers.py)."""
from elmo_core.process_env import settle

from .cpus import CpuBudget, cpu_budget, process_cpu_budget, threads_for
from .settings import check_threads, deterministic_algorithms, flushing_denormals, process_started, use_threads

settle()  # before any module here loads torch: the environment torch reads when it loads (elmo_core/process_env.py)

__all__ = ["CpuBudget", "check_threads", "cpu_budget", "deterministic_algorithms", "flushing_denormals", "process_cpu_budget",
           "process_started", "threads_for", "use_threads"]
