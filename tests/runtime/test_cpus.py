"""The default thread count comes from the CPUs the process is given (runtime.cpus): its affinity,
its cgroup's CPU quota (v2 and v1 files, read from a fake cgroup tree here) and OMP_NUM_THREADS,
the smallest; torch and ONNX Runtime run on it, and each command prints it once with the reason."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.cpus import CpuBudget, cgroup_cpu_quota, cpu_budget

ROOT = Path(__file__).resolve().parents[2]
HOST = list(range(64))


def _cgroup(tmp_path: Path, self_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    root.mkdir(exist_ok=True)
    self_cgroup = tmp_path / "self_cgroup"
    self_cgroup.write_text(self_line + "\n")
    return root, self_cgroup


def test_a_v2_quota_below_the_affinity_sets_the_count(tmp_path):
    root, me = _cgroup(tmp_path, "0::/", {"cpu.max": "200000 100000"})
    got = cpu_budget(root, me, affinity=HOST, environ={}, host_cpus=64)
    assert got == CpuBudget(2, "cgroup quota 2.0 CPUs of 64")
    assert str(got) == "2 threads: cgroup quota 2.0 CPUs of 64"


def test_the_smallest_quota_of_the_cgroup_and_those_above_it_rounded_down(tmp_path):
    root, me = _cgroup(tmp_path, "0::/kubepods/pod7/box", {
        "cpu.max": "max 100000", "kubepods/cpu.max": "800000 100000", "kubepods/pod7/cpu.max": "150000 100000",
        "kubepods/pod7/box/cpu.max": "max 100000"})
    assert cgroup_cpu_quota(root, me) == 1.5
    assert cpu_budget(root, me, affinity=HOST, environ={}, host_cpus=64) == CpuBudget(1, "cgroup quota 1.5 CPUs of 64")


def test_v1_quota_and_period(tmp_path):
    root, me = _cgroup(tmp_path, "4:memory:/x\n3:cpu,cpuacct:/docker/abc", {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"})
    assert cpu_budget(root, me, affinity=HOST, environ={}, host_cpus=64) == CpuBudget(3, "cgroup quota 3.0 CPUs of 64")


def test_no_quota_v1_minus_one_and_no_files(tmp_path):
    root, me = _cgroup(tmp_path, "3:cpu:/", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"})
    assert cgroup_cpu_quota(root, me) is None
    assert cgroup_cpu_quota(tmp_path / "absent", tmp_path / "absent_self") is None
    assert cpu_budget(root, me, affinity=HOST, environ={}, host_cpus=64) == CpuBudget(64, "64 CPUs")


def test_affinity_and_omp_num_threads(tmp_path):
    root, me = _cgroup(tmp_path, "0::/", {"cpu.max": "400000 100000"})
    assert cpu_budget(root, me, affinity=[3, 5], environ={}, host_cpus=64) == CpuBudget(2, "CPU affinity 2 of 64 CPUs")
    assert cpu_budget(root, me, affinity=HOST, environ={"OMP_NUM_THREADS": "1"}, host_cpus=64) == \
        CpuBudget(1, "OMP_NUM_THREADS=1 of 64 CPUs")
    assert cpu_budget(root, me, affinity=HOST, environ={"OMP_NUM_THREADS": "x"}, host_cpus=64).count == 4


CODE = """
import json, torch
from runtime import use_threads
from inference.onnx_backend import session_options
budget = use_threads(None)
print(json.dumps({"line": str(budget), "torch": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
                  "ort": session_options().intra_op_num_threads}))
"""


def _one_cpu_env() -> dict:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a process with 2 CPUs or more to restrict")
    return {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}


def test_a_process_on_one_cpu_runs_torch_and_onnx_runtime_on_one_thread():
    env = _one_cpu_env()
    cpu = min(os.sched_getaffinity(0))
    r = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", CODE], env=env, cwd=ROOT,
                       capture_output=True, text=True, check=True)
    got = json.loads(r.stdout)
    assert got == {"line": f"1 thread: CPU affinity 1 of {os.cpu_count()} CPUs", "torch": 1, "interop": 1, "ort": 1}


def test_embed_on_one_cpu_prints_its_threads_once(tiny_dir, tmp_path):
    from corpora.sample import write_sample_corpus

    env = _one_cpu_env()
    write_sample_corpus(tmp_path / "corpus", rows=20, files=1)
    cpu = min(os.sched_getaffinity(0))
    r = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-m", "elmo_cli", "embed", "--text", str(tmp_path / "corpus"),
                        "--out", str(tmp_path / "out"), "--model", str(tiny_dir), "--json"], env=env, cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    line = f"1 thread: CPU affinity 1 of {os.cpu_count()} CPUs"
    assert r.stderr.count(line) == 1, r.stderr
    assert json.loads(r.stdout)["run"]["threads"] == 1


def test_openmp_waits_passively_unless_the_user_chose(tmp_path):
    from elmo_core.process_env import wait_passively

    env: dict[str, str] = {}
    wait_passively(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}):
        kept = dict(chosen)
        wait_passively(kept)
        assert kept == chosen
    code = "import os, {0}; import torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
    for module in ("inference", "training", "runtime"):  # set before torch (and its OpenMP) loads
        r = subprocess.run([sys.executable, "-c", code.format(module)], env=base, cwd=ROOT, capture_output=True,
                           text=True, check=True)
        assert r.stdout.strip() == "PASSIVE", (module, r.stderr)
    r = subprocess.run([sys.executable, "-c", code.format("inference")], env={**base, "OMP_WAIT_POLICY": "ACTIVE"},
                       cwd=ROOT, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "ACTIVE"
