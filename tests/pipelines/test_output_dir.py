"""OUTPUT_DIR under abuse: one job at a time (a real lock held by a real process, then SIGKILLed),
concurrent resumes, shards verified byte for byte, SIGTERM, a full disk and a read-only file
system (real tmpfs mounts, as root), OUTPUT_DIR being a file. OUTPUT_DIR on an object store
(``s3://``, a real S3-compatible server on 127.0.0.1): the local job's rows and vectors, exactly
once after SIGKILL of the driver and ``--resume``, strays of a killed attempt never read back,
``elmo verify s3://...`` (the store's lock: test_store_lock.py; its uploads: test_store_upload.py;
Ray workers writing to it: test_object_store.py). Every wait is bounded."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
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
from pipelines import embed_parquet
from corpora.sample import write_sample_corpus
from pipelines.errors import OutputDirError
from pipelines.output_dir import open_output
from pipelines.verify import VerificationError, verify_output

from tests.helpers import run_cli as elmo
from tests.helpers import write_record
from tests.pipelines.store_utils import STORE_RUN, store_names, store_table, store_vectors, upload
from tests.processes import WAIT_S, wait_until

ROOT = Path(__file__).resolve().parents[2]
ELMO = [sys.executable, "-m", "elmo_cli"]
# A resumed job embeds the shards left in other batches (a shard alone, other neighbours in its
# sort windows), so its float32 sums run in another order than an uninterrupted job's: the bound
# of tests/pipelines/test_resume.py.
ATOL = 1e-5
SLOW = ["--rows-per-shard", "30", "--sort-window-rows", "15", "--max-batch-tokens", "300", "--threads", "1"]


def start_embed(spawn, corpus: Path, out: Path, model: Path,  # type: ignore[no-untyped-def]
                *extra: str) -> subprocess.Popen:
    cmd = ELMO + ["embed", "--text", str(corpus), "--out", str(out), "--model", str(model), "--id-column", "id", "--quiet", *SLOW, *extra]
    return spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_commits(out: Path, proc: subprocess.Popen, n: int) -> None:
    wait_until(lambda: len(list((out / "_shards").glob("part-*"))) >= n, f"{n} shards committed", proc=proc)
    assert proc.poll() is None, f"the job ended before it could be interrupted: {proc.communicate()}"


def temporaries(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.tmp"))


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    write_sample_corpus(tmp_path / "corpus", rows=900, files=2, row_group_rows=100)
    return tmp_path / "corpus"


def test_a_job_on_a_locked_output_dir_is_refused_naming_the_holder(corpus, tiny_dir, tmp_path, spawn):
    out = tmp_path / "out"
    out.mkdir()
    holder = spawn([sys.executable, "-c", "import sys, time; from pipelines.lock import OutputLock; "
                    "OutputLock.for_dir(sys.argv[1]).__enter__(); print('locked', flush=True); time.sleep(120)",
                    str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = elmo("embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--quiet")
        assert r.returncode == 2, r.stderr
        assert f"in use by another elmo embed job (pid {holder.pid} on host {socket.gethostname()}" in r.stderr
        assert not (out / "_job.parquet").exists() and "Traceback" not in r.stderr
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock, nothing is left to clean
        holder.wait()
    r = elmo("embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--quiet", "--rows-per-shard", "300")
    assert r.returncode == 0, r.stderr
    assert verify_output(out)["rows"] == 900


def test_a_running_jobs_output_dir_answers_in_use_before_whose_output_it_is(corpus, tiny_dir, tmp_path):
    """Another job (here other options) aimed at a running job's OUTPUT_DIR is told who holds it, not
    to delete the directory."""
    out = tmp_path / "out"
    out.mkdir()
    write_record(out / "_job.parquet", {"digest": "another", "inputs": [], "model": {}, "options": {}})
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pipelines.lock import OutputLock; "
                               "OutputLock.for_dir(sys.argv[1]).__enter__(); print('locked', flush=True); time.sleep(120)",
                               str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = elmo("embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--output", "top", "--quiet")
        assert r.returncode == 2 and f"in use by another elmo embed job (pid {holder.pid} on host" in r.stderr, r.stderr
        assert "holds another job's output" not in r.stderr and "delete" not in r.stderr
    finally:
        holder.kill()
        holder.wait()
    r = elmo("embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--output", "top", "--quiet")
    assert r.returncode == 2 and "holds another job's output" in r.stderr, r.stderr  # once free: whose it is


def test_two_resumes_at_once_after_sigkill_leave_one_verified_output(corpus, tiny_dir, tmp_path, spawn):
    """What broke before: both ran, one wrote _SUCCESS over a shard the other had half written."""
    out = tmp_path / "out"
    first = start_embed(spawn, corpus, out, tiny_dir)
    wait_for_commits(out, first, 3)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    a = start_embed(spawn, corpus, out, tiny_dir, "--resume", "--sort-window-rows", "64", "--max-batch-tokens", "8192")
    b = start_embed(spawn, corpus, out, tiny_dir, "--resume")
    results = [(p.wait(timeout=WAIT_S), p.communicate()[1]) for p in (a, b)]
    assert {rc for rc, _ in results} <= {0, 2} and 0 in {rc for rc, _ in results}, results
    for rc, err in results:
        assert rc == 0 or "in use by another elmo embed job" in err, err  # the loser is refused, never half-runs
    report = verify_output(out)
    assert report["rows"] == 900 and report["inputs_checked"] == 2
    again = embed_parquet(corpus, out, tiny_dir, id_column="id", rows_per_shard=30, resume=True, quiet=True)
    assert again["this_run"]["shards"] == 0 and again["this_run"]["shards_kept"] == 30


def test_verify_finds_an_altered_shard_and_resume_redoes_only_it(corpus, tiny_dir, tmp_path):
    out = tmp_path / "out"
    opts = dict(id_column="id", rows_per_shard=100, quiet=True)
    embed_parquet(corpus, out, tiny_dir, **opts)
    assert elmo("verify", "--out", out).returncode == 0
    before = ds.dataset(out, format="parquet").to_table()
    victim = out / "part-00000-00002.parquet"
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0x5A  # one byte inside a data page: the footer still reads fine
    victim.write_bytes(bytes(data))
    r = elmo("verify", "--out", out)
    assert r.returncode == 2 and "part-00000-00002.parquet: its bytes differ from its commit record" in r.stderr
    with pytest.raises(VerificationError, match="1 problem"):
        verify_output(out)
    m = embed_parquet(corpus, out, tiny_dir, resume=True, **opts)
    assert m["this_run"]["shards"] == 1 and m["this_run"]["shards_kept"] == 9
    after = ds.dataset(out, format="parquet").to_table()
    assert after.column("id").to_pylist() == before.column("id").to_pylist()
    for x, y in zip(before.column("elmo").to_pylist(), after.column("elmo").to_pylist()):
        # the redone shard's batches equal the first run's (same plan): equal bits; 1e-6 covers other thread splits
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6, rtol=0)
    assert verify_output(out)["shards"] == 10


def test_verify_lists_every_damage_one_line_each_without_a_traceback(corpus, tiny_dir, tmp_path):
    out = tmp_path / "out"
    embed_parquet(corpus, out, tiny_dir, id_column="id", rows_per_shard=100, quiet=True)
    shard = lambda k: out / f"part-00000-{k:05d}.parquet"  # noqa: E731
    shard(0).write_bytes(shard(0).read_bytes()[:-100])  # truncated
    shard(1).write_bytes(b"")  # zero bytes
    data = bytearray(shard(2).read_bytes())
    data[-12] ^= 0xFF  # inside the footer: the file no longer reads as Parquet
    shard(2).write_bytes(bytes(data))
    shard(3).unlink()
    shard(3).mkdir()  # a directory in a shard's place
    shard(4).unlink()  # deleted
    r = elmo("verify", "--out", out)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert "5 problem(s)" in lines[0], r.stderr
    for k, why in [(0, "size differs"), (1, "size differs"), (2, "its bytes differ"), (3, "a directory where a shard"),
                   (4, "listed in _manifest.parquet but missing")]:
        assert sum(shard(k).name in line and why in line for line in lines[1:]) == 1, (k, r.stderr)
    for manifest in (b"{", pa.table({"x": [1]}), {"shards": 3}):  # not Parquet, no record, a malformed record
        if isinstance(manifest, bytes):
            (out / "_manifest.parquet").write_bytes(manifest)
        elif isinstance(manifest, pa.Table):
            pq.write_table(manifest, out / "_manifest.parquet")
        else:
            write_record(out / "_manifest.parquet", manifest)
        r = elmo("verify", "--out", out)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "_manifest.parquet: " in r.stderr, r.stderr


def test_sigterm_stops_like_ctrl_c_and_resume_finishes(tiny_dir, tmp_path, spawn):
    """150 shards of ~20 ms each: seconds of runway after the second, so the signal comes mid-job
    even where the test process waits for a core (900 rows can end before it)."""
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    write_sample_corpus(corpus, rows=4500, files=2, row_group_rows=100)
    proc = start_embed(spawn, corpus, out, tiny_dir)
    wait_for_commits(out, proc, 2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 143 and "elmo embed: terminated" in err and "Traceback" not in err, err
    kept = re.search(rf"kept: (\d+) finished shards with ([\d,]+) of 4,500 rows in {re.escape(str(out))}; rerun the "
                     rf"same command with --resume", err)
    assert kept and int(kept[1]) >= 2 and int(kept[2].replace(",", "")) == 30 * int(kept[1]), err
    assert int(kept[1]) == len(list((out / "_shards").glob("part-*")))
    assert temporaries(out) == [] and not (out / "_SUCCESS").exists()
    r = elmo("embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--id-column", "id", "--quiet", "--resume", *SLOW)
    assert r.returncode == 0, r.stderr
    assert verify_output(out)["rows"] == 4500


def test_output_dir_that_is_a_file_is_a_clear_error(corpus, tiny_dir, tmp_path):
    target = tmp_path / "vectors"
    target.write_text("not a directory")
    r = elmo("embed", "--text", corpus, "--out", target, "--model", tiny_dir)
    assert r.returncode == 2 and f"{target}: exists and is not a directory" in r.stderr and "Traceback" not in r.stderr


def test_a_full_disk_is_a_clear_error_and_resume_finishes_after_freeing_space(corpus, tiny_dir, small_fs):
    out = small_fs / "out"
    args = ["embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--id-column", "id", "--rows-per-shard", "100", "--quiet"]
    r = elmo(*args)
    assert r.returncode == 2 and "No space left on device" in r.stderr and "--resume" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and temporaries(out) == []
    committed = sorted(p.name for p in out.glob("part-*.parquet"))
    assert 0 < len(committed) < 9
    subprocess.run(["mount", "-o", "remount,size=20m", str(small_fs)], check=True)
    r = elmo(*args, "--resume")
    assert r.returncode == 0, r.stderr
    assert verify_output(out)["rows"] == 900


def test_a_read_only_file_system_is_a_clear_error(corpus, tiny_dir, small_fs):
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    r = elmo("embed", "--text", corpus, "--out", small_fs / "out", "--model", tiny_dir)
    assert r.returncode == 2 and "Read-only file system" in r.stderr and "choose another OUTPUT_DIR" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def store_corpus(tmp_path_factory):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("store") / "corpus"
    write_sample_corpus(path, rows=300, files=2, row_group_rows=50)
    return path


@pytest.fixture(scope="module")
def store_model(tmp_path_factory):  # type: ignore[no-untyped-def]
    from tests.helpers import TINY_OPTIONS, make_model_dir
    return make_model_dir(tmp_path_factory.mktemp("store") / "tiny", TINY_OPTIONS)


@pytest.fixture(scope="module")
def reference(store_corpus, store_model, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The store's job on a local disk, uninterrupted."""
    out = tmp_path_factory.mktemp("store") / "reference"
    assert main(["embed", "--text", str(store_corpus), "--out", str(out), "--model", str(store_model), *STORE_RUN]) == 0
    return ds.dataset(out, format="parquet").to_table()


def test_store_to_store_equals_the_local_job_and_verifies(s3, store_corpus, store_model, reference, capsys):
    s3.create_dir("jobs")
    source = upload(s3, store_corpus, "jobs/corpus")
    assert main(["embed", "--text", source, "--out", "s3://jobs/vectors", "--model", str(store_model), *STORE_RUN, "--verify-inputs"]) == 0
    local, remote = reference, store_table(s3, "jobs/vectors")
    assert remote.column("id").to_pylist() == local.column("id").to_pylist()  # every row once, in input order
    np.testing.assert_array_equal(store_vectors(remote), store_vectors(local))  # the same process, plan and batches
    names = store_names(s3, "jobs/vectors")
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
    assert main(["info", "--out", "s3://jobs/vectors", "--json"]) == 0  # its records read, not its shards fetched
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "elmo embed output" and info["rows"] == 300 and info["shards"] == 10 and info["finished"]


def test_a_shard_changed_on_the_store_is_found_by_verify_and_redone_by_resume(s3, store_corpus, store_model):
    s3.create_dir("damaged")
    assert main(["embed", "--text", str(store_corpus), "--out", "s3://damaged/out", "--model", str(store_model), *STORE_RUN]) == 0
    first = s3.open_input_stream("damaged/out/part-00001-00002.parquet").read()
    with s3.open_output_stream("damaged/out/part-00001-00002.parquet") as f:  # same size, other bytes
        f.write(first[:100] + bytes([first[100] ^ 1]) + first[101:])
    r = subprocess.run(ELMO + ["verify", "--out", "s3://damaged/out"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "part-00001-00002.parquet: its bytes differ from its commit record (sha256)" \
        in r.stderr and "Traceback" not in r.stderr, r.stderr
    m = embed_parquet(store_corpus, "s3://damaged/out", store_model, id_column="id", rows_per_shard=30, sort_window_rows=15,
                      max_tokens_per_batch=300, threads=1, quiet=True, resume=True)
    assert (m["this_run"]["shards"], m["this_run"]["shards_kept"]) == (1, 9)  # the altered one, by its ETag
    again = pq.read_table(s3.open_input_file("damaged/out/part-00001-00002.parquet"))
    before = pq.read_table(pa.BufferReader(first))
    assert again.column("id").to_pylist() == before.column("id").to_pylist()
    np.testing.assert_allclose(store_vectors(again), store_vectors(before), atol=ATOL, rtol=0)
    assert main(["verify", "--out", "s3://damaged/out"]) == 0


@pytest.mark.parametrize("commits_before_kill", [0, 1, 4])
def test_sigkill_of_the_driver_then_resume_gives_every_row_once_in_order(s3, store_corpus, store_model, reference,
                                                                         commits_before_kill, spawn):
    """Killed before any shard, after the first, after several: ``--resume`` (at once: the lock's
    holder is a dead process on this host) keeps what was committed, aborts the killed upload and
    drops shards without a commit record; a reader then sees each input row once, in order."""
    bucket = f"kill{commits_before_kill}"
    s3.create_dir(bucket)
    out = f"s3://{bucket}/out"
    cmd = [sys.executable, "-m", "elmo_cli", "embed", "--text", str(store_corpus), "--out", out, "--model", str(store_model), *STORE_RUN]
    proc = spawn(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + WAIT_S
    wanted = "_job.parquet" if commits_before_kill == 0 else None
    while proc.poll() is None and time.monotonic() < deadline:
        names = store_names(s3, f"{bucket}/out")
        if (wanted in names) if wanted else sum(n.startswith("_shards/") for n in names) >= commits_before_kill:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = {n for n in store_names(s3, f"{bucket}/out") if n.startswith("_shards/")}
    assert len(kept) < 10 and "_SUCCESS" not in store_names(s3, f"{bucket}/out")

    assert main(["embed", "--text", str(store_corpus), "--out", out, "--model", str(store_model), *STORE_RUN, "--resume"]) == 0
    assert all(n in store_names(s3, f"{bucket}/out") for n in kept)
    table, source = store_table(s3, f"{bucket}/out"), ds.dataset(store_corpus, format="parquet").to_table()
    assert table.column("id").to_pylist() == source.column("id").to_pylist()
    np.testing.assert_allclose(store_vectors(table), store_vectors(reference), atol=ATOL, rtol=0)
    assert main(["verify", "--out", out]) == 0


def test_strays_of_a_killed_attempt_are_not_read_back(s3, store_corpus, store_model):
    """A shard completed without its commit record (a worker killed between the two) and an upload
    never completed: ``--resume`` adopts the first (its footer says it is this job's rows: its record
    is written from its bytes), aborts the second, and a late writer can never replace a committed
    shard (its completion is conditional)."""
    from storage.locations import s3_client

    s3.create_dir("strays")
    opts = dict(id_column="id", rows_per_shard=30, sort_window_rows=15, max_tokens_per_batch=300, threads=1, quiet=True)
    embed_parquet(store_corpus, "s3://strays/out", store_model, **opts)
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
    m = embed_parquet(store_corpus, "s3://strays/out", store_model, resume=True, **opts)
    assert (m["this_run"]["shards"], m["this_run"]["shards_kept"]) == (0, 10)
    assert out.read_record("_shards/part-00000-00004.parquet")["writer"] == "adopted"
    assert not client.list_multipart_uploads(Bucket="strays").get("Uploads")
    assert store_table(s3, "strays/out").column("id").to_pylist() == \
        ds.dataset(store_corpus, format="parquet").to_table().column("id").to_pylist()
