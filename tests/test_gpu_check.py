"""``python bench/gpu_check.py``: its CPU dry run's steps exit 0 and write both reports; a step past its
timeout is reported with its whole process group ended, and the next step runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import gpu_check  # noqa: E402


def test_the_dry_run_steps_exit_0_and_write_the_reports(tmp_path: Path) -> None:
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "bench/gpu_check.py", "--device", "cpu", "--only", "kernels,host_waits",
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["device"] == "cpu" and list(report["steps"]) == ["kernels", "host_waits"]
    assert {name: r["rc"] for name, r in report["steps"].items()} == {"kernels": 0, "host_waits": 0}
    assert report["steps"]["kernels"]["result"]["kernels_per_step"] > 0
    assert report["steps"]["host_waits"]["result"]["host_waits_per_batch"] is None  # a CPU has nothing to wait for
    md = (out / "gpu_check.md").read_text()
    assert "| kernels | 0 |" in md and "| host_waits | 0 |" in md


def test_a_step_past_its_timeout_is_reported_and_its_processes_end(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(gpu_check.TIMEOUTS, "serve", 2)
    monkeypatch.setattr(gpu_check, "CPU_SLACK", 1)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    work = tmp_path / "work-past-timeout"
    work.mkdir()
    t0 = time.monotonic()
    res = gpu_check.run_step("serve", work, "cpu")
    assert res["rc"] == 124 and res["error"] == "timed out after 2 s", res
    assert time.monotonic() - t0 < 30
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", str(work)], capture_output=True, text=True).stdout.split()
    assert left == [], left


def test_without_a_gpu_the_default_device_says_how_to_dry_run(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    run = subprocess.run([sys.executable, "bench/gpu_check.py", "--out", str(tmp_path / "r")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2 and "--device cpu runs the dry run" in run.stderr
    assert not (tmp_path / "r").exists()
