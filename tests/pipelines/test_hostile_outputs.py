"""What a job writes, under a hostile or unlucky user (issue #47), with real processes, signals and
file systems: planted links where the lock or a temporary file goes, foreign files in a finished
OUTPUT_DIR, OUTPUT_DIR inside INPUT (and INPUT inside OUTPUT_DIR), an input replaced while the job
runs, a rerun after a row-level input error, and --format hdf5 on a full disk or killed."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpora.sample import write_sample_corpus
from storage.atomic import temporary_name, write_text_atomic
from pipelines import embed_parquet
from pipelines.verify import verify_output

from tests.helpers import run_cli as elmo
from tests.processes import WAIT_S, wait_until

ELMO = [sys.executable, "-m", "elmo_cli"]
SLOW = ["--rows-per-shard", "30", "--sort-window-rows", "15", "--max-batch-tokens", "300", "--threads", "1"]


def elmo_process(*args: object, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(ELMO + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def start(spawn, *args: object) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    return spawn(ELMO + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_while_running(condition, proc: subprocess.Popen, what: str) -> None:  # type: ignore[no-untyped-def]
    wait_until(condition, what, proc=proc)
    assert proc.poll() is None, f"the job ended once {what}: {proc.communicate()}"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    write_sample_corpus(tmp_path / "corpus", rows=600, files=2, row_group_rows=100)
    return tmp_path / "corpus"


@pytest.mark.parametrize("kind", ["symlink", "hard link"])
def test_a_planted_lock_file_is_never_written_through(corpus, tiny_dir, tmp_path, kind):
    victim = tmp_path / "precious.txt"
    victim.write_text("precious")
    out, single = tmp_path / "out", tmp_path / "vectors.hdf5"
    out.mkdir()
    for lock in (out / ".elmo.lock", tmp_path / ".vectors.hdf5.lock"):
        os.symlink(victim, lock) if kind == "symlink" else os.link(victim, lock)
    r = elmo("embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--quiet")
    what = "a symbolic link where the lock file should be" if kind == "symlink" else "a file with 3 hard links"
    assert r.returncode == 2 and f"{out / '.elmo.lock'}: {what}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = elmo("embed", "--text", corpus, "--out", single, "--format", "hdf5", "--model", tiny_dir, "--quiet")
    assert r.returncode == 2 and f".vectors.hdf5.lock: {what}" in r.stderr, r.stderr
    assert victim.read_text() == "precious" and not single.exists() and not (out / "_job.parquet").exists()


def test_a_planted_link_at_a_temporary_name_is_replaced_not_followed(tmp_path):
    """At this writer's temporary name, or a dead writer's (removed as a leftover: the link itself)."""
    victim, folder = tmp_path / "precious.txt", tmp_path / "precious"
    victim.write_text("precious")
    (folder / "inside").mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    os.symlink(victim, temporary_name(tmp_path / "record.json"))
    os.symlink(folder, temporary_name(tmp_path / "record.json", pid=dead.pid))
    write_text_atomic(tmp_path / "record.json", "{}")
    assert victim.read_text() == "precious" and (tmp_path / "record.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious", "precious.txt", "record.json"]
    assert (folder / "inside").is_dir()


def test_a_foreign_file_or_directory_in_a_finished_output_fails_verify(corpus, tiny_dir, tmp_path):
    out = tmp_path / "out"
    embed_parquet(corpus, out, tiny_dir, rows_per_shard=200, quiet=True)
    assert elmo("verify", "--out", out).returncode == 0
    shutil.copy(next(corpus.glob("*.parquet")), out / "extra.parquet")
    r = elmo("verify", "--out", out)
    assert r.returncode == 2 and "extra.parquet: not a shard of this job, and readers of OUTPUT_DIR would read it" \
        in r.stderr, r.stderr
    (out / "extra.parquet").unlink()
    (out / "sub").mkdir()
    shutil.copy(out / "part-00000-00000.parquet", out / "sub" / "part-00000-00000.parquet")
    r = elmo("verify", "--out", out)
    assert r.returncode == 2 and "sub/: not a shard of this job" in r.stderr, r.stderr
    r = elmo("embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--rows-per-shard", "200", "--quiet", "--resume")
    assert r.returncode == 2 and "sub is not a shard of this job; move it away" in r.stderr  # resume agrees
    shutil.rmtree(out / "sub")
    assert elmo("verify", "--out", out).returncode == 0


def test_output_dir_inside_input_or_input_inside_output_dir_is_refused_before_writing(corpus, tiny_dir, tmp_path):
    r = elmo("embed", "--text", corpus, "--out", corpus / "vectors", "--model", tiny_dir, "--quiet")
    assert r.returncode == 2 and f"OUTPUT_DIR {corpus / 'vectors'} is inside INPUT {corpus}" in r.stderr, r.stderr
    assert not (corpus / "vectors").exists()
    r = elmo("embed", "--text", f"{tmp_path}/**/*.parquet", "--out", tmp_path / "deep" / "vectors", "--model", tiny_dir, "--quiet")
    assert r.returncode == 2 and "is inside INPUT" in r.stderr and not (tmp_path / "deep").exists(), r.stderr
    out = tmp_path / "out"
    (out / ".staging").mkdir(parents=True)
    shutil.copy(corpus / "corpus-00000.parquet", out / ".staging" / "in.parquet")
    r = elmo("embed", "--text", out / ".staging" / "in.parquet", "--out", out, "--model", tiny_dir, "--quiet")
    assert r.returncode == 2 and f"an input file inside OUTPUT_DIR {out}" in r.stderr, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [".staging"]
    r = elmo("embed", "--text", corpus, "--out", corpus / "_vectors", "--model", tiny_dir, "--quiet")  # a name INPUT skips
    assert r.returncode == 0, r.stderr
    assert elmo("embed", "--text", corpus, "--out", corpus / "_vectors", "--model", tiny_dir, "--quiet", "--resume").returncode == 0


def test_an_input_replaced_while_the_job_runs_stops_it_and_the_same_command_then_starts_over(corpus, tiny_dir,
                                                                                             tmp_path, spawn):
    out = tmp_path / "out"
    args = ["embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--id-column", "id", "--quiet", *SLOW]
    job = start(spawn, *args)
    wait_while_running(lambda: len(list((out / "_shards").glob("part-*"))) >= 2, job, "two shards were committed")
    first = corpus / "corpus-00000.parquet"
    table = pq.read_table(first)
    pq.write_table(table.set_column(table.schema.get_field_index("text"), "text",
                                    pa.array(["replaced row"] * table.num_rows)), tmp_path / "new.parquet")
    os.replace(tmp_path / "new.parquet", first)  # the same rows, other text
    _, err = job.communicate(timeout=WAIT_S)
    assert job.returncode == 2 and f"{first}: changed while the job ran" in err and "Traceback" not in err, err
    assert not (out / "_SUCCESS").exists()
    r = elmo(*args)  # the same command, not --resume
    assert r.returncode == 0, r.stderr
    report = verify_output(out)
    assert report["rows"] == 600 and report["inputs_checked"] == 2 and report["inputs_not_checked"] == []
    texts = pq.read_table(out / "part-00000-00000.parquet").column("elmo").to_pylist()
    assert all(len(v) == 2 for v in texts)  # "replaced row": two tokens, from the input as it is now


def test_a_rerun_after_fixing_a_row_level_input_error_works(tiny_dir, tmp_path):
    rows = [["a", "b"], ["c"]] * 50
    good = tmp_path / "in" / "a.parquet"
    good.parent.mkdir()
    pq.write_table(pa.table({"id": list(range(100)), "tokens": rows}), good)
    bad = tmp_path / "in" / "b.parquet"
    pq.write_table(pa.table({"id": list(range(100)), "tokens": rows[:60] + [["x", None]] + rows[61:]}), bad)
    out = tmp_path / "out"
    args = ["embed", "--text", good.parent, "--out", out, "--model", tiny_dir, "--tokens-column", "tokens", "--id-column", "id",
            "--rows-per-shard", "50", "--quiet"]
    r = elmo(*args)
    # the window holding row 60 spans both shards of b.parquet (windows go on past a shard's end)
    assert r.returncode == 2 and "b.parquet, rows 0..99" in r.stderr and "a token is null" in r.stderr, r.stderr
    assert "fix the input, then rerun the same command" in r.stderr and "Traceback" not in r.stderr
    # a.parquet's two shards were committed; b.parquet's first too unless the error came before its commit
    assert len(list(out.glob("part-*.parquet"))) in (2, 3)
    pq.write_table(pa.table({"id": list(range(100)), "tokens": rows}), bad)  # fixed
    r = elmo(*args)
    assert r.returncode == 0, r.stderr
    assert verify_output(out)["rows"] == 200


def test_hdf5_on_a_full_disk_exits_2_leaves_nothing_and_reruns_once_there_is_room(corpus, tiny_dir, small_fs):
    out = small_fs / "vectors.hdf5"
    for left in (small_fs / ".vectors.hdf5.999999.tmp", temporary_name(out, host="elsewhere", pid=999999)):
        left.write_bytes(b"x" * 1000)  # killed jobs' (an earlier version's; another host's): the job's lock is held
    args = ["embed", "--text", corpus, "--out", out, "--format", "hdf5", "--model", tiny_dir, "--output", "all", "--quiet"]
    r = elmo_process(*args)  # a process: libhdf5 once crashed it here
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])  # was a segfault in libhdf5 (139)
    assert "No space left on device; the disk is full: free space, then rerun the same command" in r.stderr
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
    assert sorted(p.name for p in small_fs.iterdir()) == []  # nothing: not the output, nor its lock
    subprocess.run(["mount", "-o", "remount,size=40m", str(small_fs)], check=True)
    assert elmo(*args).returncode == 0
    with h5py.File(out) as f:
        assert len(f) == 601 and f["599"].shape[0] == 3  # 600 sentences and sentence_to_index


def test_the_temporary_file_of_a_killed_hdf5_job_is_removed_by_the_next_run(corpus, tiny_dir, tmp_path, spawn):
    out = tmp_path / "vectors.hdf5"
    args = ["embed", "--text", corpus, "--out", out, "--format", "hdf5", "--model", tiny_dir, "--quiet", "--sort-window-rows", "5",
            "--max-batch-tokens", "300", "--threads", "1"]
    job = start(spawn, *args)
    wait_while_running(lambda: any(p.stat().st_size > 20_000 for p in tmp_path.glob(".vectors.hdf5.*.tmp")), job,
                       "its temporary file grew")
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    assert len(list(tmp_path.glob(".vectors.hdf5.*.tmp"))) == 1 and not out.exists()
    r = elmo(*args)
    assert r.returncode == 0, r.stderr
    assert list(tmp_path.glob(".vectors.hdf5.*.tmp")) == []
    with h5py.File(out) as f:
        assert len(f) == 601


def _edit(out: Path, name: str, **changes: object) -> None:
    """A side record of OUTPUT_DIR edited in place (its schema kept), as a hand or a tool might."""
    from pipelines.output_dir import open_output

    output = open_output(out)
    record = output.read_record(name)
    schema = pq.read_schema(out / name).remove_metadata()
    output.write_record(name, {**record, **changes}, schema)


def test_verify_fails_an_edited_record_or_a_side_file_that_polars_would_read(corpus, tiny_dir, tmp_path):
    """Each passed verify: polars and DuckDB read a stray _extra.parquet as rows (and fail on a
    file under _shards/ that is no record); edited counts, options and job records were reported
    as the output's."""
    out = tmp_path / "out"
    embed_parquet(corpus, out, tiny_dir, rows_per_shard=200, quiet=True)
    manifest, commit = out / "_manifest.parquet", out / "_shards" / "part-00000-00000.parquet"
    kept = {p: p.read_bytes() for p in (manifest, commit, out / "_job.parquet")}

    def fails(says: str) -> None:
        r = elmo("verify", "--out", out, "--json")
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
        report = json.loads(r.stdout)  # the verdict on stdout too, for a script
        assert report["ok"] is False and any(says in p for p in report["problems"]), r.stdout
        for path, data in kept.items():
            path.write_bytes(data)
        for stray in (out / "_extra.parquet", out / "_shards" / "x.bak"):
            stray.unlink(missing_ok=True)
        assert elmo("verify", "--out", out).returncode == 0

    shutil.copy(out / "part-00000-00000.parquet", out / "_extra.parquet")
    fails("_extra.parquet: not a file of this job; polars and DuckDB read every file under OUTPUT_DIR")
    (out / "_shards" / "x.bak").write_text("x")
    fails("_shards/x.bak: not the commit record of a shard of this job")
    _edit(out, "_manifest.parquet", rows=2500)
    fails("_manifest.parquet: rows 2,500, and its shards hold")
    _edit(out, "_manifest.parquet", tokens=1)
    fails("_manifest.parquet: tokens 1, and its shards hold")
    _edit(out, "_shards/part-00000-00000.parquet", tokens=7)
    fails("part-00000-00000.parquet: its counts differ: tokens")
    _edit(out, "_job.parquet", options={**open_record(out, "_job.parquet")["options"], "dtype": "float16"})
    fails("_job.parquet: its digest is not its contents'")
    options = open_record(out, "_manifest.parquet")["options"]
    _edit(out, "_manifest.parquet", options={**options, "dtype": "float16"})
    fails("_manifest.parquet: its options ['dtype'] are not _job.parquet's")


def open_record(out: Path, name: str) -> dict:
    from pipelines.output_dir import open_output

    return open_output(out).read_record(name)


def test_verify_passes_a_float_id_column_holding_nan(tiny_dir, tmp_path):
    """NaN equals nothing, so an output whose ids were the input's failed verify."""
    inp = tmp_path / "in"
    inp.mkdir()
    pq.write_table(pa.table({"id": [1.5, float("nan"), 3.0], "text": ["a b", "c", "d e f"]}), inp / "a.parquet")
    embed_parquet(inp, tmp_path / "out", tiny_dir, id_column="id", quiet=True)
    assert verify_output(tmp_path / "out")["rows"] == 3


def test_info_shows_a_damaged_manifests_fields_as_unknown(corpus, tiny_dir, tmp_path):
    """A field of another type (shards: 5) was a TypeError traceback."""
    out = tmp_path / "out"
    embed_parquet(corpus, out, tiny_dir, rows_per_shard=200, quiet=True)
    _edit(out, "_manifest.parquet", shards=5, rows="many")
    r = elmo("info", "--out", out)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "shards             -" in r.stdout and "rows               -" in r.stdout, r.stdout


def test_a_file_where_the_records_folder_was_is_named_on_resume(corpus, tiny_dir, tmp_path):
    """A bare "File exists", naming nothing."""
    out = tmp_path / "out"
    embed_parquet(corpus, out, tiny_dir, rows_per_shard=200, quiet=True)
    shutil.rmtree(out / "_shards")
    (out / "_shards").write_text("not a folder")
    (out / "_SUCCESS").unlink()
    r = elmo("embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--rows-per-shard", "200", "--quiet",
             "--resume")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{out / '_shards'}: a file where this job keeps its records (a directory); move it out" in r.stderr


def test_verify_reads_a_pooled_shard_of_several_batches(tiny_dir, tmp_path):
    """A pooled Arrow shard holds a record batch per sort window: verify raised a KeyError at the second."""
    text = tmp_path / "in.txt"
    text.write_text("".join(f"row {i} of the corpus\n" for i in range(300)))
    embed_parquet(text, tmp_path / "out", tiny_dir, pool="mean", format="arrow", sort_window_rows=64, quiet=True)
    assert verify_output(tmp_path / "out")["rows"] == 300
