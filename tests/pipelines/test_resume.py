"""Exactly once: a real ``elmo embed`` process is killed with SIGKILL mid-way, then resumed."""
from __future__ import annotations

import hashlib
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

from inference import Embedder
from pipelines import embed_parquet
from pipelines.errors import OtherJobError
from storage.atomic import digest
from pipelines.verify import VerificationError, verify_output
from corpora.sample import write_sample_corpus
from tests.helpers import read_record, write_record
from tests.processes import WAIT_S, wait_until

ATOL = 1e-5  # shards of a resumed run vs an uninterrupted one: other batch compositions, float32 sums in another order


def _shards(out: Path) -> list[Path]:
    return sorted(out.glob("part-*.parquet")) if out.exists() else []


@pytest.mark.parametrize("writer_threads", [1, 3])
def test_sigkill_then_resume_gives_every_row_exactly_once(tiny_dir, tmp_path, writer_threads, spawn):
    """With several writer threads, shards are committed out of order and several are open at the kill."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=900, files=2, row_group_rows=100)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "elmo_cli", "embed", "--text", str(corpus), "--out", str(out), "--model", str(tiny_dir),
           "--id-column", "id", "--rows-per-shard", "30", "--sort-window-rows", "15", "--max-batch-tokens",
           "300", "--threads", "1", "--writer-threads", str(writer_threads), "--quiet"]
    proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: len(_shards(out)) >= 3, "3 shards written", proc=proc)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = {p.name: p.stat().st_mtime_ns for p in _shards(out)}
    assert 3 <= len(done_before) < 30 and not (out / "_SUCCESS").exists()

    m = embed_parquet(corpus, out, tiny_dir, id_column="id", rows_per_shard=30, max_tokens_per_batch=2048,
                      resume=True, quiet=True)
    assert m["this_run"]["shards_kept"] == len(done_before) and len(m["shards"]) == 30
    assert {p.name: p.stat().st_mtime_ns for p in _shards(out) if p.name in done_before} == done_before
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    table = ds.dataset(out, format="parquet").to_table()
    source = ds.dataset(corpus, format="parquet").to_table()
    assert table.column("id").to_pylist() == source.column("id").to_pylist()  # each row once, in order
    texts = source.column("text").to_pylist()
    want = Embedder.from_files(tiny_dir).embed_sentences([t.split() for t in texts], output="mixed")
    for i, got in enumerate(table.column("elmo").to_pylist()):
        np.testing.assert_allclose(np.asarray(got, np.float32), want[i], atol=ATOL, rtol=0, err_msg=f"row {i}")
    assert m["rows"] == 900 and m["tokens"] == sum(len(t.split()) for t in texts)


def test_sigkill_with_windows_across_shards_then_resume_gives_the_uninterrupted_jobs_vectors(tiny_dir, tmp_path,
                                                                                             spawn):
    """Windows of 75 rows over shards of 30 (each window in pieces of three shards, on three writer
    threads), killed mid-way: the resume reads the same windows (the committed shards' rows computed
    and dropped), so its shards hold the vectors an uninterrupted job writes, bit for bit."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=900, files=2, row_group_rows=100)
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    flags = {"rows_per_shard": 30, "sort_window_rows": 75, "max_tokens_per_batch": 300, "threads": 1,
             "writer_threads": 3}
    cmd = [sys.executable, "-m", "elmo_cli", "embed", "--text", str(corpus), "--out", str(out), "--model", str(tiny_dir),
           "--id-column", "id", "--quiet", "--rows-per-shard", "30", "--sort-window-rows", "75", "--max-batch-tokens",
           "300", "--threads", "1", "--writer-threads", "3"]
    proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: len(_shards(out)) >= 4, "4 shards written", proc=proc)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = {p.name for p in _shards(out)}
    assert 4 <= len(done_before) < 30
    m = embed_parquet(corpus, out, tiny_dir, id_column="id", resume=True, quiet=True, **flags)
    assert m["this_run"]["shards_kept"] == len(done_before) and len(m["shards"]) == 30
    embed_parquet(corpus, fresh, tiny_dir, id_column="id", quiet=True, **flags)
    a, b = ds.dataset(out, format="parquet").to_table(), ds.dataset(fresh, format="parquet").to_table()
    assert a.column("id").to_pylist() == ds.dataset(corpus, format="parquet").to_table().column("id").to_pylist()
    assert a.column("elmo").equals(b.column("elmo"))


def test_resume_redoes_a_damaged_shard(tiny_dir, tmp_path):
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=60, files=1)
    out = tmp_path / "out"
    opts = dict(id_column="id", rows_per_shard=20, quiet=True)
    embed_parquet(corpus, out, tiny_dir, **opts)
    first = ds.dataset(out, format="parquet").to_table()
    victim = out / "part-00000-00001.parquet"
    victim.write_bytes(victim.read_bytes()[:-200])  # truncated: its footer is gone
    (out / ".part-00000-00002.parquet.tmp").write_bytes(b"half")
    m = embed_parquet(corpus, out, tiny_dir, resume=True, **opts)
    assert m["this_run"]["shards"] == 1 and m["this_run"]["shards_kept"] == 2
    again = ds.dataset(out, format="parquet").to_table()
    assert again.column("id").to_pylist() == first.column("id").to_pylist()
    for a, b in zip(first.column("elmo").to_pylist(), again.column("elmo").to_pylist()):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=ATOL, rtol=0)
    with pytest.raises(Exception, match="not a shard of this job"):
        (out / "part-00009-00000.parquet").write_bytes(b"x")
        embed_parquet(corpus, out, tiny_dir, resume=True, **opts)


def test_a_resumed_job_weighs_a_compiled_layouts_warm_up_against_the_tokens_left(tiny_dir, tmp_path):
    """The run's expected tokens (``ModelRun.expected_tokens``, which ``--layout auto`` weighs) are
    the job's on its first run, those of the shards not yet written on a resumed one."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=60, files=1)
    out = tmp_path / "out"
    opts = dict(id_column="id", rows_per_shard=20, quiet=True)
    whole = embed_parquet(corpus, out, tiny_dir, **opts)["run"]["expected_tokens"]
    (out / "part-00000-00001.parquet").unlink()  # its commit record stays: as a kill between the two leaves it
    m = embed_parquet(corpus, out, tiny_dir, resume=True, **opts)
    assert m["this_run"]["shards"] == 1 and whole > 300
    assert m["run"]["expected_tokens"] == whole * 20 // 60


def _rewrite_shard(out: Path, name: str, ids: list | None = None, **footer: object) -> None:
    """Shard ``name`` rewritten with these values in its footer record (and these ``ids`` in its id
    column), and its commit record and the manifest's entry made to match: what a writer holding
    those values would have committed."""
    path = out / name
    table, record = pq.read_table(path), json.loads(pq.read_metadata(path).metadata[b"elmo.shard"])
    if ids is not None:
        table = table.set_column(table.schema.get_field_index("id"), "id", pa.array(ids))
    with pq.ParquetWriter(path, table.schema) as writer:
        writer.write_table(table)
        writer.add_key_value_metadata({b"elmo.shard": json.dumps({**record, **footer}, sort_keys=True)})
    digest = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "bytes": path.stat().st_size}
    commit = out / "_shards" / name
    write_record(commit, {**read_record(commit), **footer, **digest})
    if (out / "_manifest.parquet").exists():
        manifest = read_record(out / "_manifest.parquet")
        for shard in manifest["shards"]:
            if shard["file"] == name:
                shard.update(digest)
        write_record(out / "_manifest.parquet", manifest)


def test_verify_and_resume_refuse_a_shard_computed_with_another_model(tiny_dir, tmp_path):
    """Each shard records the sha256 of the model its writer loaded: a shard of another model than
    the job's is no shard of the job's, whatever job digest it carries."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=60, files=1)
    out = tmp_path / "out"
    opts = dict(id_column="id", rows_per_shard=20, quiet=True)
    embed_parquet(corpus, out, tiny_dir, **opts)
    job_model = read_record(out / "_job.parquet")["model"]["sha256"]
    records = [read_record(p) for p in sorted((out / "_shards").glob("part-*"))]
    assert [r["model_sha256"] for r in records] == [job_model] * 3
    _rewrite_shard(out, "part-00000-00001.parquet", model_sha256="0" * 64)
    with pytest.raises(VerificationError, match=r"1 problem\(s\):\n  part-00000-00001.parquet: computed with another "
                                                r"model \(sha256 0000000000000000\.\.\.\) than the job's"):
        verify_output(out)
    m = embed_parquet(corpus, out, tiny_dir, resume=True, **opts)
    assert m["this_run"]["shards"] == 1 and m["this_run"]["shards_kept"] == 2
    assert verify_output(out)["rows"] == 60


def test_an_output_whose_records_are_json_files_is_refused_with_the_reason(tiny_dir, tmp_path, capsys):
    """An OUTPUT_DIR of an earlier version (``_job.json``, ``_manifest.json``): ``--resume`` and
    ``elmo verify`` say why they do not take it, exit 2, and write nothing."""
    from elmo_cli.main import main

    corpus, out = tmp_path / "corpus", tmp_path / "out"
    write_sample_corpus(corpus, rows=20, files=1)
    embed_parquet(corpus, out, tiny_dir, id_column="id", quiet=True)
    for name in ("_job", "_manifest"):
        (out / f"{name}.json").write_text(json.dumps(read_record(out / f"{name}.parquet")))
        (out / f"{name}.parquet").unlink()
    before = sorted(p.name for p in out.rglob("*"))
    for args in (["embed", "--text", str(corpus), "--out", str(out), "--model", str(tiny_dir), "--id-column", "id", "--resume"],
                 ["verify", "--out", str(out)]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"{out / '_job.json'}: the job record of an earlier elmo embed, whose side files are JSON" in err, err
        assert "Traceback" not in err and sorted(p.name for p in out.rglob("*")) == before


def _finished_job(tiny_dir: Path, tmp_path: Path) -> tuple[Path, Path, dict, dict]:
    """A finished 60-row job in three shards: (corpus, OUTPUT_DIR, its options, its job record's
    inputs, model and options), for a test to edit the record as an earlier version wrote it."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=60, files=1)
    out = tmp_path / "out"
    opts = dict(id_column="id", rows_per_shard=20, quiet=True)
    embed_parquet(corpus, out, tiny_dir, **opts)
    record = read_record(out / "_job.parquet")
    return corpus, out, opts, {k: record[k] for k in ("inputs", "model", "options")}


def test_a_job_recorded_with_its_engine_resumes_under_another(tiny_dir, tmp_path):
    """The engine does not change the output: a job whose record counted it (as jobs did) resumes
    under another engine, its shards kept."""
    corpus, out, opts, old = _finished_job(tiny_dir, tmp_path)
    old["options"] = {**old["options"], "engine": "spark"}
    write_record(out / "_job.parquet", {**old, "digest": digest(old)})
    for shard in _shards(out):
        _rewrite_shard(out, shard.name, job=digest(old))
    for name in ("_SUCCESS", "_manifest.parquet", "part-00000-00002.parquet", "_shards/part-00000-00002.parquet"):
        (out / name).unlink()
    m = embed_parquet(corpus, out, tiny_dir, resume=True, **opts)
    assert m["this_run"]["shards"] == 1 and m["this_run"]["shards_kept"] == 2 and m["job_digest"] == digest(old)
    assert verify_output(out)["rows"] == 60


def test_a_job_an_earlier_version_recorded_with_less_of_the_model_is_refused_naming_that(tiny_dir, tmp_path):
    """A job record that lacks a model field this version records (a dictionary model's
    ``dictionaries_sha256`` did not exist before) is refused on --resume, saying so: not that the
    model's files changed, when every field it recorded still holds."""
    corpus, out, opts, old = _finished_job(tiny_dir, tmp_path)
    old["model"] = {k: v for k, v in old["model"].items() if k != "options_sha256"}  # as if not recorded then
    write_record(out / "_job.parquet", {**old, "digest": digest(old)})
    with pytest.raises(OtherJobError, match=r"an earlier version of elmo-pipeline started the job and did not record "
                                            r"the model's options_sha256: finish it with that version, or use another"):
        embed_parquet(corpus, out, tiny_dir, resume=True, **opts)
    old["model"] = {**old["model"], "sha256": "0" * 64}  # and a field it recorded differs: the files changed
    write_record(out / "_job.parquet", {**old, "digest": digest(old)})
    with pytest.raises(OtherJobError, match=r"the files of the model .* changed since the job started"):
        embed_parquet(corpus, out, tiny_dir, resume=True, **opts)


def test_a_job_whose_shards_hold_other_column_types_is_refused_on_resume_before_the_model_loads(tiny_dir, tmp_path,
                                                                                               monkeypatch):
    """An earlier version read a CSV's ids as integers; this one reads them as the strings they are:
    resuming its job would mix int64 and string shards, so it is refused naming the column, before
    the model's weights are read (the vectors' type is options.json's: ``claim_first``)."""
    import formats.model_dir
    from pipelines.output_dir import LocalDir

    corpus, out, opts, _ = _finished_job(tiny_dir, tmp_path)
    record = read_record(out / "_job.parquet")
    schema = pq.read_schema(out / "_job.parquet")
    older = schema.set(schema.get_field_index("id"), pa.field("id", pa.string()))  # the sample's ids are int64
    LocalDir(out).write_record("_job.parquet", record, older)
    (out / "_SUCCESS").unlink()
    loads, load_weights = [], formats.model_dir.load_weights
    monkeypatch.setattr(formats.model_dir, "load_weights", lambda *a: (loads.append(a), load_weights(*a)))
    with pytest.raises(OtherJobError, match=r"_job.parquet: the job's shards hold other columns than this run would "
                                            r"write \('id' string there, int64 now\): an earlier version"):
        embed_parquet(corpus, out, tiny_dir, resume=True, **opts)
    assert loads == [] and not (out / ".elmo.lock").exists()  # nothing loaded, OUTPUT_DIR as it was
    LocalDir(out).write_record("_job.parquet", record, schema)
    assert embed_parquet(corpus, out, tiny_dir, resume=True, **opts)["this_run"]["shards_kept"] == 3
    assert len(loads) == 1  # the job's one load, counted where it happens


def test_verify_reads_a_csv_output_an_earlier_version_typed_by_inference(tiny_dir, tmp_path):
    """An earlier version wrote a CSV's ids 1, 2, ... as int64; they are read now as the strings
    "1", "2", ...: verify compares them as written, and still finds an id that is not the input's."""
    corpus = tmp_path / "ids.csv"
    corpus.write_text("id,text\n" + "".join(f"{'' if i == 2 else i},row number {i}\n" for i in range(1, 7)))
    out = tmp_path / "out"
    embed_parquet(corpus, out, tiny_dir, id_column="id", rows_per_shard=3, quiet=True)
    for k, shard in enumerate(_shards(out)):  # as it typed them: a blank id null
        _rewrite_shard(out, shard.name, ids=[None if i == 2 else i for i in range(1 + 3 * k, 4 + 3 * k)])
    assert verify_output(out)["rows"] == 6
    _rewrite_shard(out, _shards(out)[1].name, ids=[4, 5, 7])
    with pytest.raises(VerificationError, match=r"part-00000-00001.parquet: its id column is not the input's rows 3"):
        verify_output(out)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_shard_published_without_its_commit_record_is_adopted_with_its_counts(tiny_dir, tmp_path, fmt):
    """A writer killed between publishing its shard and writing its commit record: the resume adopts
    the shard from its footer, which holds the counts as well as the identity (an Arrow shard's held
    the identity only: the resume then failed on the manifest's tokens, every time)."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=60, files=1)
    out = tmp_path / "out"
    opts = dict(id_column="id", rows_per_shard=20, quiet=True, format=fmt)
    embed_parquet(corpus, out, tiny_dir, **opts)
    name = f"part-00000-00001.{fmt}"
    before = read_record(out / "_shards" / name)
    for gone in ("_SUCCESS", f"_manifest.{fmt}", f"_shards/{name}"):
        (out / gone).unlink()
    m = embed_parquet(corpus, out, tiny_dir, resume=True, **opts)
    assert (m["this_run"]["shards"], m["this_run"]["shards_kept"]) == (0, 3)
    after = read_record(out / "_shards" / name)
    assert after["writer"] == "adopted" and after["tokens"] == before["tokens"] > 0
    assert {k: v for k, v in after.items() if k != "writer"} == {k: v for k, v in before.items() if k != "writer"}
    assert verify_output(out)["rows"] == 60
    if fmt == "arrow":  # an earlier version's shard, its identity alone in its footer: written again
        import pyarrow.ipc as ipc

        table = ipc.open_file(out / name).read_all()
        with ipc.new_file(out / name, table.schema) as writer:
            writer.write_table(table)
        for gone in ("_SUCCESS", f"_manifest.{fmt}", f"_shards/{name}"):
            (out / gone).unlink()
        m = embed_parquet(corpus, out, tiny_dir, resume=True, **opts)
        assert (m["this_run"]["shards"], m["this_run"]["shards_kept"]) == (1, 2)
        assert read_record(out / "_shards" / name)["tokens"] == before["tokens"] and verify_output(out)["rows"] == 60


def test_a_refused_resume_leaves_the_output_as_it_was_without_a_lock_file(tiny_dir, tmp_path):
    """A resume refused under the lock (a shard renamed, not this job's) writes nothing: the lock file
    it made goes too."""
    from pipelines.errors import OutputDirError

    corpus, out, opts, _ = _finished_job(tiny_dir, tmp_path)
    (out / "part-00000-00001.parquet").rename(out / "part-00000-00007.parquet")
    before = sorted(p.name for p in out.rglob("*"))
    with pytest.raises(OutputDirError, match="part-00000-00007.parquet is not a shard of this job"):
        embed_parquet(corpus, out, tiny_dir, resume=True, **opts)
    assert sorted(p.name for p in out.rglob("*")) == before and not (out / ".elmo.lock").exists()


def test_sigkill_of_a_ray_driver_takes_its_local_cluster_with_it(tiny_dir, tmp_path, spawn):
    pytest.importorskip("ray", reason="Ray is the optional 'ray' extra")
    from runtime.ray_local import descendants

    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=900, files=2, row_group_rows=100)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "elmo_cli", "embed", "--text", str(corpus), "--out", str(out), "--model", str(tiny_dir), "--engine",
           "ray", "--replicas", "1", "--rows-per-shard", "30", "--sort-window-rows", "15", "--threads", "1", "--quiet"]
    proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: list((out / "_shards").glob("part-*")), "a shard committed", proc=proc)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.communicate()}"
    cluster = descendants(proc.pid)
    assert cluster, "the driver started no processes"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    def running(pid: int) -> bool:  # a zombie (state Z) has ended; only its parent's wait() is missing
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + WAIT_S
    while any(map(running, cluster)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in cluster if running(p)]
    assert not left, f"processes of the killed driver's Ray cluster still run: {left}"
    r = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_progress_counts_rows_and_tokens_alike_over_a_resume():
    import io

    from pipelines.progress import ProgressBar

    progress = ProgressBar(100, done_rows=40, stream=io.StringIO(), done_tokens=400)  # 40 rows kept, 400 tokens
    progress.update(10, 100)
    line = progress.line(progress.t0 + 2.0)
    assert "rows 50/100" in line and "tokens 500 |" in line and "| 50 tokens/s |" in line, line  # rate: this run's


def test_a_jobs_identity_has_the_keys_jobs_recorded_before_the_vectors_were_one_record():
    """The vectors' request is one record inside the options, flattened into the identity a resumed
    job is compared by: the keys (and values) jobs recorded before, nothing new."""
    from pipelines.options import EmbedOptions

    got = EmbedOptions.coerce(pool="mean", mix=[1, 2, 3], normalize=True, id_column="id").identity("torch", "fp32")
    assert got == {"text_column": "text", "tokens_column": None, "id_column": "id", "keep_columns": [],
                   "output": "mixed", "mix": [1.0, 2.0, 3.0], "gamma": 1.0, "pool": "mean", "normalize": True,
                   "dtype": "float32", "max_sentence_length": 256, "window_context": 32, "rows_per_shard": None,
                   "backend": "torch"}
    assert "layer_norm" not in EmbedOptions().to_dict()  # a manifest's options: the keys older versions read
