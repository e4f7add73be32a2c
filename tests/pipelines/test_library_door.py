"""``pipelines.embed_parquet`` in a fresh interpreter runs as fast as ``elmo embed`` on the same job
beside a busy core: the library gets the CLI's thread settings whatever it imports first."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import make_model_dir, tiny_options

ROOT = Path(__file__).resolve().parents[2]
ROWS, ROUNDS, BOUND = 400, 2, 1.15
UNSET = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "ONEDNN_PRIMITIVE_CACHE_CAPACITY",
         "LRU_CACHE_CAPACITY")
LIBRARY = "import sys, pipelines; pipelines.embed_parquet(sys.argv[1], sys.argv[2], model=sys.argv[3])"


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return time.perf_counter() - t0


def test_library_call_within_bound_of_the_cli_beside_a_busy_core(tmp_path, spawn):
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env["PYTHONPATH"] = str(ROOT)
    model = make_model_dir(tmp_path / "model", tiny_options(lstm__dim=256, lstm__projection_dim=64))
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, "-m", "elmo_cli", "sample-corpus", str(corpus), "--rows", str(ROWS), "--files", "1"],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    spawn([sys.executable, "-c", "while True: pass"])
    best = {"cli": float("inf"), "library": float("inf")}
    for i in range(ROUNDS):  # in turns, so drifting load falls on both alike
        cli = [sys.executable, "-m", "elmo_cli", "embed", str(corpus), str(tmp_path / f"cli{i}"), "--model", str(model),
               "--quiet"]
        best["cli"] = min(best["cli"], _timed(cli, env))
        library = [sys.executable, "-c", LIBRARY, str(corpus), str(tmp_path / f"lib{i}"), str(model)]
        best["library"] = min(best["library"], _timed(library, env))
    assert best["library"] <= BOUND * best["cli"], best
