"""``elmo serve --engine ray``: two Ray Serve replicas on a real local Ray cluster answer exactly
what the local server answers, ``--precision auto`` is judged by a replica's CPU, SIGTERM tears the
cluster down, and a SIGKILL during start-up leaves no process or folder behind."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from tests.helpers import SENTENCES, TINY_OPTIONS, make_model_dir
from tests.processes import WAIT_S

from .server_utils import ServerProcess, decode

pytest.importorskip("ray.serve", reason="Ray Serve (the ray and serve extras) is not installed")
pytestmark = pytest.mark.slow


def test_two_replicas_answer_what_the_local_server_answers(tmp_path: Path):
    model = make_model_dir(tmp_path / "tiny", TINY_OPTIONS)
    rng = random.Random(0)
    bodies = [{"sentences": rng.sample(SENTENCES, rng.randint(1, 5)), "output": rng.choice(["mixed", "all"]),
               "pool": rng.choice(["none", "mean"]), "encoding": rng.choice(["float", "base64"])} for _ in range(24)]
    local = ServerProcess(model, "--quiet")
    try:
        want = [httpx.post(f"{local.url}/embed", json=b, timeout=60).json() for b in bodies]
    finally:
        local.stop()
    ray_server = ServerProcess(model, "--engine", "ray", "--replicas", "2", "--precision", "auto", "--quiet",
                               timeout=180)
    try:
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda b: httpx.post(f"{ray_server.url}/embed", json=b, timeout=60), bodies))
        for body, answer, expected in zip(bodies, got, want):
            assert answer.status_code == 200, answer.text
            for g, w in zip(answer.json()["embeddings"], expected["embeddings"], strict=True):
                shape = np.asarray(decode(w, body["encoding"], (-1,))).shape
                # a server batch (other rows beside it) vs the sentence alone: fp32 sums in another order, a few ulp x the recurrence
                np.testing.assert_allclose(decode(g, body["encoding"], shape), decode(w, body["encoding"], shape),
                                           atol=1e-5, rtol=0)
        bad = httpx.post(f"{ray_server.url}/embed", json={"sentences": [["a", 3]]}, timeout=30)
        assert bad.status_code == 422 and "sentences[0][1]" in bad.json()["error"]["message"]
        info = httpx.get(f"{ray_server.url}/info", timeout=30).json()
        assert info["dim"] == 16
        assert info["run"]["precision_reason"].startswith("judged by a worker's CPU: ")  # where the model runs
        assert info["precision"] == "fp32"  # the tiny model's products: too small for bf16
        cluster = psutil.Process(ray_server.proc.pid).children(recursive=True)
        assert cluster, "the local Ray cluster runs below the server"
        long = {"sentences": [[f"w{j}" for j in range(200)]] * 200, "output": "all"}  # seconds each on 2 cores
        with ThreadPoolExecutor(4) as pool:  # in flight at SIGTERM: each answered whole (they were dropped)
            flying = [pool.submit(httpx.post, f"{ray_server.url}/embed", json=long, timeout=120) for _ in range(4)]
            time.sleep(1.0)
            ray_server.terminate()
            assert [f.result().status_code for f in flying] == [200] * 4
        assert ray_server.wait(120) == 0, "\n".join(ray_server.stderr[-20:])
        gone, alive = psutil.wait_procs(cluster, timeout=WAIT_S)
        assert not alive, f"left running after SIGTERM: {[p.pid for p in alive]}"
    finally:
        ray_server.stop()


def test_a_sigkill_during_ray_start_up_orphans_nothing(tmp_path: Path, spawn):
    """The reaper is armed before ``ray.init``: kill the server while its local cluster starts, and
    every process of that cluster ends and its session folder goes."""
    from runtime.ray_local import descendants, marked

    model = make_model_dir(tmp_path / "tiny", TINY_OPTIONS)
    proc = spawn([sys.executable, "-m", "elmo_cli", "serve", "--model", str(model), "--engine", "ray", "--port", "0",
                  "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder, deadline = None, time.monotonic() + WAIT_S
    while folder is None and time.monotonic() < deadline and proc.poll() is None:
        for pid in descendants(proc.pid):  # the GCS server is the first process ray.init starts
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline[0].endswith(b"gcs_server"):
                log_dir = next(a for a in cmdline if a.startswith(b"--log_dir=")).decode().split("=", 1)[1]
                folder = log_dir.split("/session_")[0]
        time.sleep(0.05)
    assert folder is not None and proc.poll() is None, "ray.init never started its GCS server"
    assert Path(folder).name.startswith("elmo-ray-")
    os.kill(proc.pid, signal.SIGKILL)  # mid start-up: ray.init has not returned
    proc.wait()
    deadline = time.monotonic() + WAIT_S
    while (marked(folder) or Path(folder).exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p, Path(f"/proc/{p}/cmdline").read_bytes()[:80]) for p in marked(folder)]
    assert not left, f"Ray processes of the killed server still run: {left}"
    assert not Path(folder).exists(), f"the cluster's folder {folder} was left behind"
