"""The library is a door as fast as the CLI (issue #56, F1): ``pipelines.embed_parquet`` in a fresh
interpreter, beside a busy core, within 1.4x of ``elmo embed`` on the same job, taking turns, in
the CPU seconds the job spent (its manifest's: less noisy than its wall time beside a busy core,
and where spinning OpenMP workers show). It was 4-18x slower in wall time when ``import pipelines``
loaded torch before OpenMP's wait policy was set (its idle workers spun against the busy process);
tests/runtime/test_settings.py checks that order."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from corpora.sample import write_sample_corpus

from tests.helpers import TINY_OPTIONS, make_model_dir

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("import json, sys, pipelines; m = pipelines.embed_parquet(sys.argv[1], sys.argv[2], sys.argv[3], "
           "quiet=True, threads=2); print(json.dumps(m))")


def _cpu_seconds(cmd: list[str]) -> float:
    """The job's CPU seconds (its manifest's): spinning OpenMP workers show there, whatever the load."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, env={**env, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)["stages"]["process_cpu_seconds"]


def test_the_library_runs_a_job_as_fast_as_the_cli_beside_a_busy_core(tmp_path):
    corpus, model = tmp_path / "corpus", make_model_dir(tmp_path / "tiny", TINY_OPTIONS)
    write_sample_corpus(corpus, rows=1000, files=1, row_group_rows=500)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        best = {"library": float("inf"), "cli": float("inf")}
        for turn in range(3):
            best["library"] = min(best["library"], _cpu_seconds([sys.executable, "-c", LIBRARY, str(corpus),
                                                             str(tmp_path / f"lib{turn}"), str(model)]))
            best["cli"] = min(best["cli"], _cpu_seconds([sys.executable, "-m", "elmo_cli", "embed", "--text", str(corpus),
                                                     "--out", str(tmp_path / f"cli{turn}"), "--model", str(model), "--threads",
                                                     "2", "--json", "--quiet"]))
    finally:
        busy.kill()
        busy.wait()
    # spinning workers cost 4-18x; the same job's best of 3 turns spreads up to 1.26x (0.52 vs 0.41 CPU s)
    # when the suite's other worker shares the cores with the busy process
    assert best["library"] <= 1.4 * best["cli"], best
