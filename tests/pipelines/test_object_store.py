"""Models on an object store (``--model s3://bucket/model``), against a real S3-compatible server on
127.0.0.1 (moto's standalone server, the ``s3test`` extra): fetched once per machine into the
local cache, the same vectors as the local model, fetched again when the store's files change;
credentials never printed. INPUT on a store (a file or a prefix) gives the local job's rows and
vectors; Ray workers read and write only the store. (OUTPUT_DIR on a store: test_output_dir.py,
test_store_lock.py, test_store_upload.py.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

from elmo_cli.main import main
from corpora.sample import write_sample_corpus
from pipelines.output_dir import open_output
from tests.pipelines.store_utils import upload
from tests.helpers import read_record
from tests.processes import WAIT_S, wait_until

ROOT = Path(__file__).resolve().parents[2]


def _vectors(out: Path) -> np.ndarray:
    return np.concatenate([np.asarray(v, np.float32) for v in
                           ds.dataset(out, format="parquet").to_table().column("elmo").to_pylist()])  # (N, D)


def test_a_model_on_the_store_is_fetched_once_and_gives_the_local_vectors(s3, tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path / "cache"))
    uri = upload(s3, tiny_dir, "models/tiny")
    write_sample_corpus(tmp_path / "corpus", rows=40, files=1)
    run = ["embed", "--text", str(tmp_path / "corpus"), "--output", "mixed", "--quiet"]
    assert main([*run[:3], "--out", str(tmp_path / "local"), "--model", str(tiny_dir), *run[3:]]) == 0
    assert main([*run[:3], "--out", str(tmp_path / "remote"), "--model", uri, *run[3:]]) == 0
    np.testing.assert_array_equal(_vectors(tmp_path / "remote"), _vectors(tmp_path / "local"))
    [copy] = list((tmp_path / "cache" / "remote").iterdir())
    assert read_record(tmp_path / "remote" / "_manifest.parquet")["model"]["path"] == uri
    stamp = (copy / ".complete").stat().st_mtime_ns

    assert main([*run[:3], "--out", str(tmp_path / "again"), "--model", uri, *run[3:]]) == 0  # the same files: no fetch
    assert list((tmp_path / "cache" / "remote").iterdir()) == [copy] and (copy / ".complete").stat().st_mtime_ns == stamp

    with s3.open_output_stream("models/tiny/options.json") as out:  # the store's model changes
        out.write((tiny_dir / "options.json").read_bytes() + b"\n")
    assert main([*run[:3], "--out", str(tmp_path / "changed"), "--model", uri, *run[3:]]) == 0
    assert len(list((tmp_path / "cache" / "remote").iterdir())) == 2


def test_a_corpus_on_the_store_gives_the_local_jobs_rows_and_vectors(s3, tiny_dir, tmp_path, capsys):
    """INPUT s3://bucket/prefix (two files, a hidden one skipped) to a local OUTPUT_DIR: the same
    rows, order and vectors as the same files on a local disk; ``elmo verify`` checks the inputs
    where they live."""
    write_sample_corpus(tmp_path / "corpus", rows=60, files=2)
    s3.create_dir("corpora")
    uri = upload(s3, tmp_path / "corpus", "corpora/sotu")
    with s3.open_output_stream("corpora/sotu/_scratch/ignored.parquet") as out:
        out.write(b"not parquet: skipped like a local _ directory")
    run = ["--model", str(tiny_dir), "--id-column", "id", "--rows-per-shard", "25", "--quiet"]
    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "local"), *run]) == 0
    assert main(["embed", "--text", uri, "--out", str(tmp_path / "remote"), *run]) == 0
    local = ds.dataset(tmp_path / "local", format="parquet").to_table()
    remote = ds.dataset(tmp_path / "remote", format="parquet").to_table()
    assert remote.column("id").to_pylist() == local.column("id").to_pylist()
    np.testing.assert_array_equal(_vectors(tmp_path / "remote"), _vectors(tmp_path / "local"))
    inputs = read_record(tmp_path / "remote" / "_manifest.parquet")["inputs"]
    assert [i["path"] for i in inputs] == [f"{uri}/{f.name}" for f in sorted((tmp_path / "corpus").iterdir())]
    assert main(["verify", "--out", str(tmp_path / "remote")]) == 0
    assert "against 2 input file(s)" in capsys.readouterr().out  # read where they live, not skipped


def test_store_errors_are_clear_and_never_show_the_secret(s3, tiny_dir, tmp_path, capsys):
    write_sample_corpus(tmp_path / "corpus", rows=5, files=1)
    env = dict(os.environ, ELMO_CACHE_DIR=str(tmp_path / "cache"))
    cases = [(["s3://models/nothing-here"], "no files there"),
             ([str(tiny_dir), "s3://models/no-corpus"], "s3://models/no-corpus: no such file or directory on the store")]
    for model_and_input, message in cases:
        model, source = model_and_input[0], model_and_input[1] if len(model_and_input) > 1 else str(tmp_path / "corpus")
        r = subprocess.run([sys.executable, "-m", "elmo_cli", "embed", "--text", source, "--out", str(tmp_path / "out"), "--model", model,
                            "--quiet"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in r.stderr + r.stdout
    refused = [("gs://bucket/out", [], "OUTPUT_DIR gs://bucket/out: elmo embed writes to a local or shared file system "
                                      "or to s3://"),
               ("s3://no-bucket/out", [], "s3://no-bucket/out: no bucket no-bucket on this store (create it first)"),
               ("s3://models/out.hdf5", ["--format", "hdf5"], "--format hdf5 writes a local file")]
    for out, flags, message in refused:  # in this process: refused before any model runs
        capsys.readouterr()
        assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", out, "--model", str(tiny_dir), *flags, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and os.environ["AWS_SECRET_ACCESS_KEY"] not in err, err


def test_serve_runs_a_model_from_the_store(s3, tiny_dir, tmp_path, monkeypatch):
    import httpx

    from inference import Embedder
    from tests.helpers import SENTENCES
    from tests.serving.server_utils import ServerProcess, reference

    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path / "cache"))
    uri = upload(s3, tiny_dir, "models/served")
    server = ServerProcess(uri)  # type: ignore[arg-type]
    try:
        info = httpx.get(f"{server.url}/info").json()
        assert (info["model"], info["path"]) == ("served", uri)
        answer = httpx.post(f"{server.url}/embed", json={"sentences": [SENTENCES[0]]})
        with Embedder.open(tiny_dir) as embedder:  # the sentence alone either way: the same sums
            np.testing.assert_array_equal(np.asarray(answer.json()["embeddings"][0], np.float32),
                                          reference(embedder, SENTENCES[0]))
    finally:
        server.stop()


def test_ray_workers_read_and_write_only_the_store_and_survive_a_killed_worker(s3, tiny_dir, tmp_path, spawn):
    """--engine ray, 2 workers, INPUT, OUTPUT_DIR and --model on the store (no shared disk): each
    worker reads its input shards, fetches the model and uploads its output shards itself. One
    worker SIGKILLed mid-job: the driver stops with a clear error (exit 2, no traceback); then
    ``--resume`` gives every row once, in order, with the local runner's vectors."""
    pytest.importorskip("ray", reason="Ray is the optional 'ray' extra")
    import signal

    from runtime.ray_local import descendants
    from pipelines import embed_parquet

    write_sample_corpus(tmp_path / "corpus", rows=300, files=2, row_group_rows=50)
    s3.create_dir("raycorpus")
    source, model = upload(s3, tmp_path / "corpus", "raycorpus/c"), upload(s3, tiny_dir, "models/ray")
    cmd = [sys.executable, "-m", "elmo_cli", "embed", "--text", source, "--out", "s3://raycorpus/vectors", "--model", model, "--engine",
           "ray", "--replicas", "2", "--rows-per-shard", "15", "--sort-window-rows", "15", "--threads", "1",
           "--id-column", "id", "--quiet"]
    env = dict(os.environ, ELMO_CACHE_DIR=str(tmp_path / "cache"))  # the workers' environment comes from it
    proc = spawn(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    selector = pafs.FileSelector("raycorpus/vectors/_shards", allow_not_found=True)
    wait_until(lambda: s3.get_file_info(selector), "a shard on the store", proc=proc)
    workers = [p for p in descendants(proc.pid) if b"ShardWorker" in _cmdline(p)]
    assert proc.poll() is None and workers, f"no worker to kill: {proc.poll()}"
    os.kill(workers[0], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 2 and "a Ray worker died while it wrote a shard" in stderr \
        and "rerun with --resume" in stderr and "Traceback" not in stderr, stderr

    r = subprocess.run([*cmd, "--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    embed_parquet(tmp_path / "corpus", tmp_path / "local", tiny_dir, id_column="id", rows_per_shard=15,
                  sort_window_rows=15, quiet=True)
    local = ds.dataset(tmp_path / "local", format="parquet").to_table()
    remote = ds.dataset("raycorpus/vectors", format="parquet", filesystem=s3).to_table()  # what a reader sees
    assert remote.column("id").to_pylist() == local.column("id").to_pylist() == list(range(300))
    # the same predictor and plan; only the threads differ (see tests/pipelines/test_ray_runner.py): 1e-6
    np.testing.assert_allclose(np.concatenate([np.asarray(v, np.float32) for v in remote.column("elmo").to_pylist()]),
                               _vectors(tmp_path / "local"), atol=1e-6, rtol=0)
    commits = [i.path for i in s3.get_file_info(pafs.FileSelector("raycorpus/vectors/_shards"))]
    store = open_output("s3://raycorpus/vectors")
    writers = {store.read_record(p[len("raycorpus/vectors/"):])["writer"] for p in commits}
    assert len(commits) == 20 and len(writers) >= 2  # written by the workers, not the driver
    assert main(["verify", "--out", "s3://raycorpus/vectors"]) == 0


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
