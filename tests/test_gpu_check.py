"""``bench/gpu_check.py --device cpu``: the GPU check's dry run, every step it takes small on the CPU
(the model, serve and kernels steps too in the full dry run, about 90 s: `make gpu-check DEVICE=cpu`).
Here the steps that exercise its machinery: each in its own process under its timeout, a failing
step reported without stopping the others, one JSON and one markdown report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_dry_run_writes_its_report_and_says_which_steps_failed(tmp_path):
    r = subprocess.run([sys.executable, "bench/gpu_check.py", "--device", "cpu", "--out", str(tmp_path),
                        "--only", "embed,train,syncs"], capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    steps = report["steps"]
    assert set(steps) == {"embed", "train", "syncs"} and all(s["ok"] for s in steps.values()), steps
    assert steps["embed"]["tokens_per_s"] > 0 and steps["embed"]["run"]["batch"]["tokens"] == 4096
    assert steps["train"]["tokens_per_s"] > 0 and steps["train"]["precision"] == "fp32"
    assert steps["syncs"]["host_waits_per_batch"] <= 8
    assert "| embed | yes |" in (tmp_path / "gpu_check.md").read_text()
    bad = subprocess.run([sys.executable, "bench/gpu_check.py", "--device", "cpu", "--out", str(tmp_path / "bad"),
                          "--only", "embed,syncs", "--timeout-scale", "0.01"], capture_output=True, text=True,
                         cwd=ROOT, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    steps = json.loads((tmp_path / "bad" / "gpu_check.json").read_text())["steps"]
    assert bad.returncode == 1 and not steps["embed"]["ok"] and "timed out after 1 s" in steps["embed"]["error"], steps
    assert set(steps) == {"embed", "syncs"}  # the next step ran too
