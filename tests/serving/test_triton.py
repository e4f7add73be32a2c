"""``elmo export triton``: the repository's layout, and a real tritonserver (nvidia-pytriton's, in
the side environment of ``scripts/setup_triton.sh``) answering what the local server answers."""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers import SENTENCES, TINY_OPTIONS, make_model_dir

from .server_utils import ROOT, ServerProcess

TRITON_VENV = Path(os.environ.get("ELMO_TRITON_VENV", "/tmp/peer-triton"))
SITE = TRITON_VENV / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
D = 2 * TINY_OPTIONS["lstm"]["projection_dim"]


def export_triton(model: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "elmo_cli", "export", "triton", "--model", str(model), "--out",
                           str(out), *args], cwd=ROOT, capture_output=True, text=True)


def test_the_repository_holds_config_code_and_model(tmp_path: Path):
    model = make_model_dir(tmp_path / "tiny", TINY_OPTIONS)
    done = export_triton(model, tmp_path / "repo", "--instances", "2", "--max-batch-size", "16",
                         "--max-wait-ms", "0.5", "--kind", "gpu")
    assert done.returncode == 0, done.stderr
    target = tmp_path / "repo" / "elmo"
    config = (target / "config.pbtxt").read_text()
    for line in ('backend: "python"', "max_batch_size: 16", "allow_ragged_batch: true", f"dims: [ -1, {D} ]",
                 "count: 2 kind: KIND_GPU", "max_queue_delay_microseconds: 500", 'string_value: "torch"'):
        assert line in config, line
    assert (target / "1" / "model.py").read_text() == (ROOT / "export" / "triton_model.py").read_text()
    assert sorted(p.name for p in (target / "1" / "model").iterdir()) == ["options.json", "weights.hdf5"]
    again = export_triton(model, tmp_path / "repo")
    assert again.returncode == 2 and "exists" in again.stderr
    not_export = export_triton(model, tmp_path / "repo2", "--backend", "onnx")
    assert not_export.returncode == 2 and "elmo export onnx" in not_export.stderr


def test_an_export_directory_is_served_by_its_own_backend_unless_told(tmp_path: Path):
    """--backend, as in elmo embed and elmo serve: left out, an export directory's own (its manifest.json)."""
    model = make_model_dir(tmp_path / "tiny", TINY_OPTIONS)
    onnx = tmp_path / "onnx"
    done = subprocess.run([sys.executable, "-m", "elmo_cli", "export", "onnx", "--model", str(model), "--out", str(onnx),
                           "--no-validate"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert export_triton(onnx, tmp_path / "repo").returncode == 0
    config = (tmp_path / "repo" / "elmo" / "config.pbtxt").read_text()
    assert 'key: "backend" value: { string_value: "onnx" }' in config
    assert (tmp_path / "repo" / "elmo" / "1" / "model" / "model.onnx").is_file()
    told = export_triton(onnx, tmp_path / "repo2", "--backend", "torch")
    assert told.returncode == 2 and "add --backend onnx" in told.stderr, told.stderr


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_tritonserver(repo: Path, workdir: Path) -> tuple[subprocess.Popen, str]:
    """tritonserver from nvidia-pytriton's wheel, its Python backend given the 3.11 stub.

    The stub loads libpython3.11.so by name: without LD_LIBRARY_PATH set to this interpreter's
    LIBDIR it finds Debian's 3.11.2 and fails on the interpreter's 3.11.7 standard library
    ('_thread.RLock' object has no attribute '_recursion_count'). The venv's bin/ first on PATH
    makes the stub's Python that venv (as pytriton does); PYTHONPATH gives it this checkout.
    """
    server = SITE / "pytriton" / "tritonserver"
    backends = workdir / "backends" / "python"
    backends.mkdir(parents=True)
    for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
        (backends / f).symlink_to(server / "backends" / "python" / f)
    (backends / "triton_python_backend_stub").symlink_to(
        server / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / "triton_python_backend_stub")
    http, grpc, metrics = _free_ports(3)
    env = dict(os.environ, PATH=f"{TRITON_VENV / 'bin'}:{os.environ['PATH']}", PYTHONPATH=str(ROOT),
               LD_LIBRARY_PATH=f"{sysconfig.get_config_var('LIBDIR')}:{SITE / 'nvidia_pytriton.libs'}")
    proc = subprocess.Popen([str(server / "bin" / "tritonserver"), "--model-repository", str(repo),
                             "--backend-directory", str(workdir / "backends"), "--http-port", str(http),
                             "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--allow-metrics", "false"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{http}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"tritonserver did not get ready:\n{proc.communicate()[0][-4000:]}")


def infer(url: str, sentences: list[list[str]]) -> dict[str, np.ndarray]:
    width = max(map(len, sentences))
    data = [t for s in sentences for t in s + [""] * (width - len(s))]
    body = {"inputs": [{"name": "TOKENS", "shape": [len(sentences), width], "datatype": "BYTES", "data": data}]}
    answer = httpx.post(f"{url}/v2/models/elmo/infer", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in answer.json()["outputs"]}


@pytest.mark.slow
def test_tritonserver_answers_what_the_local_server_answers(tmp_path: Path):
    if not (SITE / "pytriton" / "tritonserver" / "bin" / "tritonserver").is_file():
        pytest.skip(f"no Triton side environment at {TRITON_VENV}: run scripts/setup_triton.sh")
    model = make_model_dir(tmp_path / "tiny", TINY_OPTIONS)
    assert export_triton(model, tmp_path / "repo", "--max-wait-ms", "20").returncode == 0
    rng = random.Random(0)
    requests = [rng.sample(SENTENCES, rng.randint(1, 5)) for _ in range(16)]
    local = ServerProcess(model, "--quiet")
    try:
        want = [(httpx.post(f"{local.url}/embed", json={"sentences": r}).json()["embeddings"],
                 httpx.post(f"{local.url}/embed", json={"sentences": r, "pool": "mean"}).json()["embeddings"])
                for r in requests]
    finally:
        local.stop()
    proc, url = start_tritonserver(tmp_path / "repo", tmp_path)
    try:
        with ThreadPoolExecutor(8) as pool:  # concurrent: the dynamic batcher puts ragged requests together
            got = list(pool.map(lambda r: infer(url, r), requests))
        for sentences, answer, (tokens_want, pooled_want) in zip(requests, got, want):
            assert answer["EMBEDDINGS"].shape == (len(sentences), max(map(len, sentences)), D)
            for i, s in enumerate(sentences):
                # a server batch (other rows beside it) vs the sentence alone: fp32 sums in another order, a few ulp x the recurrence
                np.testing.assert_allclose(answer["EMBEDDINGS"][i, : len(s)], tokens_want[i], atol=1e-5, rtol=0)
                assert not answer["EMBEDDINGS"][i, len(s):].any()
                np.testing.assert_allclose(answer["SENTENCE_EMBEDDINGS"][i], pooled_want[i], atol=1e-5, rtol=0)
        stats = httpx.get(f"{url}/v2/models/elmo/stats").json()["model_stats"][0]
        assert stats["inference_count"] == sum(map(len, requests))
    finally:
        proc.terminate()
        proc.wait(60)
