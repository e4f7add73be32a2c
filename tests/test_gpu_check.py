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


def test_the_whole_dry_run_exits_0_at_every_step_and_writes_the_reports(tmp_path: Path) -> None:
    """Every step of the dry run, so a command a step calls cannot drift from the CLI unseen."""
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "bench/gpu_check.py", "--device", "cpu", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["device"] == "cpu" and tuple(report["steps"]) == gpu_check.STEPS
    failed = {name: r.get("error", "")[-1500:] for name, r in report["steps"].items() if r["rc"] != 0}
    assert not failed, failed
    assert run.returncode == 0, run.stderr[-3000:]
    assert report["steps"]["kernels"]["result"]["kernels_per_step"] > 0
    assert report["steps"]["host_waits"]["result"]["host_waits_per_batch"] is None  # a CPU has nothing to wait for
    assert report["steps"]["embed"]["result"]["tokens"] > 0
    md = (out / "gpu_check.md").read_text()
    assert all(f"| {name} | 0 |" in md for name in gpu_check.STEPS)


def test_a_step_past_its_timeout_is_reported_and_its_processes_end(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(gpu_check.TIMEOUTS, "serve", 2)
    monkeypatch.setattr(gpu_check, "CPU_SLACK", 1)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    from tests.helpers import TINY_OPTIONS, make_model_dir

    work = tmp_path / "work-past-timeout"
    # a model to serve, so the step outlasts 2 s with its server up (without one it failed on the
    # missing model, in 1.8 s on a fast CPU, before its timeout)
    make_model_dir(work / "model", TINY_OPTIONS)
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
