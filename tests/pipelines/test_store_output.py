"""OUTPUT_DIR on an object store (``s3://``), against a real S3-compatible server on 127.0.0.1:
the same rows and vectors as a local job, exactly once after SIGKILL of the driver and
``--resume``, one driver at a time (a lease taken and renewed by conditional writes), strays of a
killed attempt never read back, ``elmo verify s3://...``. (Ray workers writing to the store:
test_object_store.py.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from elmo_cli.main import main
from corpora.sample import write_sample_corpus
from pipelines.errors import OutputDirError
from pipelines.output_dir import open_output
from tests.pipelines.store_utils import upload
from tests.processes import WAIT_S, wait_until

ROOT = Path(__file__).resolve().parents[2]
# A resumed job embeds the shards left in other batches (a shard alone, other neighbours in its
# sort windows), so its float32 sums run in another order than an uninterrupted job's: the bound
# of tests/pipelines/test_resume.py.
ATOL = 1e-5
RUN = ["--id-column", "id", "--rows-per-shard", "30", "--sort-window-rows", "15", "--max-batch-tokens", "300",
       "--threads", "1", "--quiet"]


def _table(s3, prefix: str):  # type: ignore[no-untyped-def]
    """What a reader of the store sees: pyarrow.dataset over the prefix (``_`` and ``.`` names skipped)."""
    return ds.dataset(prefix, format="parquet", filesystem=s3).to_table()


def _vectors(table) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.concatenate([np.asarray(v, np.float32) for v in table.column("elmo").to_pylist()])  # (N, D)


def _names(s3, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    import pyarrow.fs as pafs
    selector = pafs.FileSelector(prefix, recursive=True, allow_not_found=True)
    return sorted(i.path[len(prefix) + 1:] for i in s3.get_file_info(selector) if i.is_file)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "elmo_cli", *args], cwd=ROOT, env=env or dict(os.environ),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def corpus(s3, tmp_path_factory):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("store") / "corpus"
    write_sample_corpus(path, rows=300, files=2, row_group_rows=50)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory):  # type: ignore[no-untyped-def]
    from tests.helpers import TINY_OPTIONS, make_model_dir
    return make_model_dir(tmp_path_factory.mktemp("store") / "tiny", TINY_OPTIONS)


@pytest.fixture(scope="module")
def reference(corpus, model, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The same job on a local disk, uninterrupted."""
    out = tmp_path_factory.mktemp("store") / "reference"
    assert main(["embed", "--text", str(corpus), "--out", str(out), "--model", str(model), *RUN]) == 0
    return ds.dataset(out, format="parquet").to_table()


def test_store_to_store_equals_the_local_job_and_verifies(s3, corpus, model, reference, capsys):
    s3.create_dir("jobs")
    source = upload(s3, corpus, "jobs/corpus")
    assert main(["embed", "--text", source, "--out", "s3://jobs/vectors", "--model", str(model), *RUN, "--verify-inputs"]) == 0
    local, remote = reference, _table(s3, "jobs/vectors")
    assert remote.column("id").to_pylist() == local.column("id").to_pylist()  # every row once, in input order
    np.testing.assert_array_equal(_vectors(remote), _vectors(local))  # the same process, plan and batches
    names = _names(s3, "jobs/vectors")
    shards = [n for n in names if n.startswith("part-")]
    assert len(shards) == 10 and {"_SUCCESS", "_job.parquet", "_manifest.parquet"} <= set(names)
    assert len(names) == 2 * len(shards) + 3  # a commit record per shard, nothing else left behind (no lock)
    out = open_output("s3://jobs/vectors")
    job = out.read_record("_job.parquet")
    assert sorted(job["input_sha256"]) == [f"{source}/corpus-00000.parquet", f"{source}/corpus-00001.parquet"]
    manifest = out.read_record("_manifest.parquet")
    assert [s["file"] for s in manifest["shards"]] == shards and manifest["rows"] == 300
    pl = pytest.importorskip("polars", reason="polars is in the dev extra")
    options = {"aws_endpoint_url": os.environ["AWS_ENDPOINT_URL"], "aws_region": "us-east-1", "aws_allow_http": "true",
               "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
               "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"]}
    for frame in (pl.read_parquet("s3://jobs/vectors/", storage_options=options),  # the directory as it is
                  pl.scan_parquet("s3://jobs/vectors/", storage_options=options).collect()):
        assert frame["id"].to_list() == local.column("id").to_pylist()
    capsys.readouterr()
    assert main(["verify", "--out", "s3://jobs/vectors"]) == 0
    assert "against 2 input file(s)" in capsys.readouterr().out


def test_a_shard_changed_on_the_store_is_found_by_verify_and_redone_by_resume(s3, corpus, model):
    s3.create_dir("damaged")
    assert main(["embed", "--text", str(corpus), "--out", "s3://damaged/out", "--model", str(model), *RUN]) == 0
    first = s3.open_input_stream("damaged/out/part-00001-00002.parquet").read()
    with s3.open_output_stream("damaged/out/part-00001-00002.parquet") as f:  # same size, other bytes
        f.write(first[:100] + bytes([first[100] ^ 1]) + first[101:])
    r = _cli("verify", "--out", "s3://damaged/out")
    assert r.returncode == 2 and "part-00001-00002.parquet: its bytes differ from its commit record (sha256)" \
        in r.stderr and "Traceback" not in r.stderr, r.stderr
    from pipelines import embed_parquet
    m = embed_parquet(corpus, "s3://damaged/out", model, id_column="id", rows_per_shard=30, sort_window_rows=15,
                      max_tokens_per_batch=300, threads=1, quiet=True, resume=True)
    assert (m["this_run"]["shards"], m["this_run"]["shards_kept"]) == (1, 9)  # the altered one, by its ETag
    again = pq.read_table(s3.open_input_file("damaged/out/part-00001-00002.parquet"))
    before = pq.read_table(pa.BufferReader(first))
    assert again.column("id").to_pylist() == before.column("id").to_pylist()
    np.testing.assert_allclose(_vectors(again), _vectors(before), atol=ATOL, rtol=0)
    assert main(["verify", "--out", "s3://damaged/out"]) == 0


@pytest.mark.parametrize("commits_before_kill", [0, 1, 4])
def test_sigkill_of_the_driver_then_resume_gives_every_row_once_in_order(s3, corpus, model, reference,
                                                                         commits_before_kill, spawn):
    """Killed before any shard, after the first, after several: ``--resume`` (at once: the lock's
    holder is a dead process on this host) keeps what was committed, aborts the killed upload and
    drops shards without a commit record; a reader then sees each input row once, in order."""
    bucket = f"kill{commits_before_kill}"
    s3.create_dir(bucket)
    out = f"s3://{bucket}/out"
    cmd = [sys.executable, "-m", "elmo_cli", "embed", "--text", str(corpus), "--out", out, "--model", str(model), *RUN]
    proc = spawn(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + WAIT_S
    wanted = "_job.parquet" if commits_before_kill == 0 else None
    while proc.poll() is None and time.monotonic() < deadline:
        names = _names(s3, f"{bucket}/out")
        if (wanted in names) if wanted else sum(n.startswith("_shards/") for n in names) >= commits_before_kill:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = {n for n in _names(s3, f"{bucket}/out") if n.startswith("_shards/")}
    assert len(kept) < 10 and "_SUCCESS" not in _names(s3, f"{bucket}/out")

    assert main(["embed", "--text", str(corpus), "--out", out, "--model", str(model), *RUN, "--resume"]) == 0
    assert all(n in _names(s3, f"{bucket}/out") for n in kept)
    table, source = _table(s3, f"{bucket}/out"), ds.dataset(corpus, format="parquet").to_table()
    assert table.column("id").to_pylist() == source.column("id").to_pylist()
    np.testing.assert_allclose(_vectors(table), _vectors(reference), atol=ATOL, rtol=0)
    assert main(["verify", "--out", out]) == 0


def test_strays_of_a_killed_attempt_are_not_read_back(s3, corpus, model):
    """A shard completed without its commit record (a worker killed between the two) and an upload
    never completed: ``--resume`` adopts the first (its footer says it is this job's rows: its record
    is written from its bytes), aborts the second, and a late writer can never replace a committed
    shard (its completion is conditional)."""
    from pipelines import embed_parquet
    from pipelines.output_dir import open_output
    from storage.locations import s3_client

    s3.create_dir("strays")
    opts = dict(id_column="id", rows_per_shard=30, sort_window_rows=15, max_tokens_per_batch=300, threads=1, quiet=True)
    embed_parquet(corpus, "s3://strays/out", model, **opts)
    committed = s3.open_input_stream("strays/out/part-00000-00003.parquet").read()
    out = open_output("s3://strays/out")
    late = out.shard_sink("part-00000-00003.parquet")  # a worker of a dead attempt, finishing late
    late.write(b"PAR1 stale bytes of a dead attempt")
    with pytest.raises(OutputDirError, match="another writer created it"):
        late.finish()
    assert s3.open_input_stream("strays/out/part-00000-00003.parquet").read() == committed

    out.delete("_shards/part-00000-00004.parquet")  # completed, then killed before its commit record
    out.delete("_SUCCESS")
    client = s3_client()
    client.create_multipart_upload(Bucket="strays", Key="out/part-00001-00000.parquet")  # killed mid-upload
    m = embed_parquet(corpus, "s3://strays/out", model, resume=True, **opts)
    assert (m["this_run"]["shards"], m["this_run"]["shards_kept"]) == (0, 10)
    assert out.read_record("_shards/part-00000-00004.parquet")["writer"] == "adopted"
    assert not client.list_multipart_uploads(Bucket="strays").get("Uploads")
    assert _table(s3, "strays/out").column("id").to_pylist() == \
        ds.dataset(corpus, format="parquet").to_table().column("id").to_pylist()


def test_two_drivers_on_one_output_the_second_is_refused(s3, corpus, model, capsys, spawn):
    """A driver holding the lock (a real process) refuses a second, naming it; SIGKILLed, it frees
    the lock at once on this host. A holder elsewhere frees it when its lease runs out."""
    s3.create_dir("locks")
    holder = spawn([sys.executable, "-c", "import sys, time; from pipelines.output_dir import open_output; "
                    "open_output(sys.argv[1]).lock().__enter__(); print('locked', flush=True); "
                    "time.sleep(120)", "s3://locks/out"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        capsys.readouterr()
        assert main(["embed", "--text", str(corpus), "--out", "s3://locks/out", "--model", str(model), *RUN]) == 2
        assert f"s3://locks/out is in use by another elmo embed job (pid {holder.pid} on host" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert main(["embed", "--text", str(corpus), "--out", "s3://locks/out", "--model", str(model), *RUN, "--resume"]) == 0

    def held_elsewhere(lease: float) -> None:
        record = {"pid": 1, "host": "another-node", "released": False, "since": "then", "lease_seconds": lease,
                  "command": "elmo embed ..."}
        with s3.open_output_stream("locks/out/.elmo.lock") as f:
            f.write(json.dumps(record).encode())

    held_elsewhere(3600.0)
    capsys.readouterr()
    assert main(["embed", "--text", str(corpus), "--out", "s3://locks/out", "--model", str(model), *RUN, "--resume"]) == 2
    assert "(pid 1 on host another-node" in capsys.readouterr().err
    held_elsewhere(1.0)
    time.sleep(2.5)  # the store's clock (its Last-Modified against its Date) says the lease ran out
    assert main(["embed", "--text", str(corpus), "--out", "s3://locks/out", "--model", str(model), *RUN, "--resume"]) == 0


def test_a_driver_that_lost_its_lease_stops_before_its_manifest(s3):
    """The lease is renewed every lease/4 s by a conditional write; once another driver has taken
    the lock (after the lease ran out), the renewal fails and the job may not commit its manifest."""
    from pipelines.output_dir import open_output
    from pipelines.store_lock import StoreLock

    s3.create_dir("lease")
    with StoreLock(open_output("s3://lease/out"), lease=0.4) as lock:
        time.sleep(0.5)  # longer than the lease: still held, as it was renewed
        lock.check()
        with s3.open_output_stream("lease/out/.elmo.lock") as f:  # taken by another after a stall of this one
            f.write(json.dumps({"pid": 1, "host": "another-node", "released": False, "lease_seconds": 120}).encode())
        wait_until(lambda: lock.lost, "the renewal found the lock taken")
        with pytest.raises(OutputDirError, match="this job lost its lock"):
            lock.check()
    assert json.loads(s3.open_input_stream("lease/out/.elmo.lock").read())["host"] == "another-node"  # not released


def test_a_finished_job_deletes_its_own_lock_object_never_another_jobs(s3):
    """``finished`` deletes the lock object only if it is still the version this job wrote (a
    conditional delete): a lock another driver wrote meanwhile stays, neither deleted nor released."""
    from pipelines.output_dir import open_output
    from pipelines.store_lock import StoreLock

    s3.create_dir("finish")
    with StoreLock(open_output("s3://finish/mine")) as lock:
        lock.finished()
    assert _names(s3, "finish/mine") == []
    theirs = json.dumps({"pid": 1, "host": "another-node", "released": False, "lease_seconds": 120}).encode()
    with StoreLock(open_output("s3://finish/theirs")) as lock:
        with s3.open_output_stream("finish/theirs/.elmo.lock") as f:  # taken by another after a stall of this one
            f.write(theirs)
        lock.finished()
    assert s3.open_input_stream("finish/theirs/.elmo.lock").read() == theirs


def test_a_large_shard_travels_in_parts_and_appears_whole(s3, monkeypatch):
    """Parts of 5 MiB (the store's minimum), sent while more is written: the object appears only
    when completed, byte for byte, with the sha256 of what was written; an aborted one never does."""
    import hashlib

    from storage.locations import s3_client
    from pipelines import store_upload
    from pipelines.output_dir import open_output

    monkeypatch.setattr(store_upload, "PART_BYTES", 5 << 20)
    s3.create_dir("parts")
    out, data = open_output("s3://parts/out"), np.random.default_rng(0).bytes((12 << 20) + 123)
    upload = out.shard_sink("part-00000-00000.parquet")
    for i in range(0, len(data), 1 << 20):
        upload.write(data[i:i + (1 << 20)])
    assert out.size("part-00000-00000.parquet") is None  # three parts sent or travelling, nothing visible
    record = upload.finish()
    assert record["sha256"] == hashlib.sha256(data).hexdigest() and record["bytes"] == len(data)
    assert record["etag"].endswith('-3"') and s3.open_input_stream("parts/out/part-00000-00000.parquet").read() == data

    aborted = out.shard_sink("part-00000-00001.parquet")
    aborted.write(data[: 6 << 20])
    aborted.abort()
    assert out.size("part-00000-00001.parquet") is None
    assert not s3_client().list_multipart_uploads(Bucket="parts").get("Uploads")
