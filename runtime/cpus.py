"""How many CPUs this process is given, and so how many threads its kernels run on by default.

A process may run on fewer CPUs than the machine has: its CPU affinity (``taskset``, a cpuset, a
batch scheduler's binding) and its cgroup's CPU quota (Kubernetes limits, ``docker --cpus``; cgroup
v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, the process's own cgroup and each
one above it). torch and ONNX Runtime size their pools by the host's cores; more threads than CPUs
make their workers wait at every barrier for one that is not running. The default is the smallest
of the affinity, the quota (rounded down, at least 1) and ``OMP_NUM_THREADS`` where the user set it.

Those threads wait passively (OpenMP's ``OMP_WAIT_POLICY=PASSIVE``, settled by every package's ``__init__``:
``elmo_core/process_env.py``; ONNX Runtime's sessions without spinning).
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
_V1_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


@dataclass(frozen=True)
class CpuBudget:
    """A thread count and why: ``str()`` is the line printed once per command."""

    count: int
    reason: str

    def __str__(self) -> str:
        return f"{self.count} thread{'s' if self.count != 1 else ''}: {self.reason}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cgroup_paths(self_cgroup: Path) -> tuple[str, str]:
    """(the v2 path, the v1 cpu controller's path) of this process's cgroup, "/" when unknown."""
    v2 = v1 = "/"
    for line in (_read(self_cgroup) or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    return v2, v1


def _upwards(base: Path, path: str) -> Iterable[Path]:
    """``base/path``, then each directory above it up to ``base``."""
    parts = [p for p in path.split("/") if p]
    for n in range(len(parts), -1, -1):
        yield base.joinpath(*parts[:n])


def _quota(directory: Path) -> float | None:
    """CPUs the cgroup at ``directory`` may use (v2 or v1 files there), None: no limit or no files."""
    v2 = _read(directory / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
    else:
        quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    try:
        q, p = int(quota or ""), int(period or "100000")
    except ValueError:  # v2 writes "max" for no limit
        return None
    return q / p if q > 0 and p > 0 else None  # v1 writes -1 for no limit


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> float | None:
    """The smallest CPU quota (in CPUs) of this process's cgroup and those above it; None: none."""
    v2_path, v1_path = _cgroup_paths(self_cgroup)
    places = list(_upwards(root, v2_path))
    places += [d for name in _V1_DIRS for d in _upwards(root / name, v1_path)]
    quotas = [q for q in map(_quota, places) if q is not None]
    return min(quotas) if quotas else None


def cpu_budget(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP, affinity: Iterable[int] | None = None,
               environ: Mapping[str, str] | None = None, host_cpus: int | None = None) -> CpuBudget:
    """The default thread count and its reason (see the module doc); every source injectable."""
    host = host_cpus or os.cpu_count() or 1
    allowed = len(set(affinity if affinity is not None else os.sched_getaffinity(0))) or 1
    quota = cgroup_cpu_quota(root, self_cgroup)
    omp = (os.environ if environ is None else environ).get("OMP_NUM_THREADS", "").strip()
    env = int(omp) if omp.isdigit() and int(omp) > 0 else None
    candidates = [(allowed, f"CPU affinity {allowed} of {host} CPUs" if allowed < host else f"{host} CPUs")]
    if quota is not None:
        candidates.append((max(1, math.floor(quota + 1e-9)), f"cgroup quota {quota:.1f} CPUs of {allowed}"))
    if env is not None:
        candidates.append((env, f"OMP_NUM_THREADS={env} of {allowed} CPUs"))
    return CpuBudget(*min(candidates, key=lambda c: c[0]))


@functools.lru_cache(maxsize=1)
def process_cpu_budget() -> CpuBudget:
    """This process's ``cpu_budget()``, read once."""
    return cpu_budget()


def threads_for(threads: int | None) -> CpuBudget:
    """The threads a run uses: ``threads`` as given (--threads), else this process's budget."""
    return CpuBudget(threads, "--threads") if threads else process_cpu_budget()
