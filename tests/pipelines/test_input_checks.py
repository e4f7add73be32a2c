"""Inputs and models under abuse: files whose columns disagree, a model or input that cannot work
(refused before OUTPUT_DIR is touched, so fixing the cause and rerunning works), inputs edited
between a run and its resume, invalid UTF-8, the published file names and --weights."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from elmo_core.errors import InputError
from inference import Embedder
from pipelines import embed_parquet
from pipelines.verify import verify_output

from tests.helpers import run_cli as elmo
from tests.helpers import read_record


def write(path: Path, **columns: pa.Array) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


TEXTS = ["The cat sat on the mat .", "Green ideas sleep .", "A third row"]


def test_columns_of_different_types_across_files_are_refused_before_anything_is_written(tiny_dir, tmp_path):
    write(tmp_path / "in" / "a.parquet", id=pa.array([1, 2], pa.int64()), text=pa.array(TEXTS[:2]))
    write(tmp_path / "in" / "b.parquet", id=pa.array(["x", "y"]), text=pa.array(TEXTS[1:]))
    out = tmp_path / "out"
    r = elmo("embed", "--text", tmp_path / "in", "--out", out, "--model", tiny_dir, "--id-column", "id")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "column 'id' has different types in the input files (int64 in a.parquet; string in b.parquet)" in r.stderr
    assert not out.exists()
    r = elmo("embed", "--text", tmp_path / "in", "--out", out, "--model", tiny_dir)  # without the column: fine
    assert r.returncode == 0, r.stderr
    assert verify_output(out)["rows"] == 4
    (tmp_path / "jsonl").mkdir()  # JSON Lines keeps JSON's types (CSV's are strings: test_input_formats.py)
    (tmp_path / "jsonl" / "a.jsonl").write_text('{"id": 1, "text": "a b"}\n')
    (tmp_path / "jsonl" / "b.jsonl").write_text('{"id": "x1", "text": "c"}\n')
    r = elmo("embed", "--text", tmp_path / "jsonl", "--out", tmp_path / "out2", "--model", tiny_dir,
             "--id-column", "id")
    assert r.returncode == 2 and "(int64 in a.jsonl; string in b.jsonl)" in r.stderr, r.stderr
    assert "a JSON Lines key keeps JSON's types: write its values alike in every file" in r.stderr
    (tmp_path / "in" / "c.csv").write_text("id,text\n3,d e\n")  # a glob may mix formats: a CSV id is a string
    r = elmo("embed", "--text", f"{tmp_path / 'in'}/[ac].*", "--out", tmp_path / "out3", "--model", tiny_dir,
             "--id-column", "id")
    assert r.returncode == 2 and "(int64 in a.parquet; string in c.csv)" in r.stderr, r.stderr
    assert "a CSV or TSV column is read as strings (the characters of its fields)" in r.stderr


def test_the_advice_for_a_column_of_different_types_follows_the_files_that_differ(tmp_path):
    """Two JSON Lines files give 'id' as integers, a Parquet file as strings: the Parquet file is the
    odd one, so the advice is to rewrite it, not JSON's (which named a format whose files agree). A
    CSV file gives only strings, so where one is in the job, the others follow it (JSON's "all
    integers" could not)."""
    from pipelines.options import EmbedOptions
    from pipelines.source import passthrough_schema, scan_inputs

    write(tmp_path / "in" / "c.parquet", id=pa.array(["x"]), text=pa.array(TEXTS[:1]))
    for name, n in (("a", 1), ("b", 2)):
        (tmp_path / "in" / f"{name}.jsonl").write_text(json.dumps({"id": n, "text": TEXTS[n]}) + "\n")
    opts = EmbedOptions(id_column="id")

    def refusal(pattern: str) -> str:
        with pytest.raises(InputError) as e:
            passthrough_schema(scan_inputs(f"{tmp_path / 'in'}/{pattern}", opts), opts)
        return str(e.value)

    message = refusal("[abc].*")
    assert "(int64 in a.jsonl, b.jsonl; string in c.parquet)" in message, message
    assert "every file must give it one type: rewrite the odd files with that type, or leave" in message
    (tmp_path / "in" / "d.csv").write_text("id,text\n7,d e\n")
    message = refusal("[abd].*")
    assert "(int64 in a.jsonl, b.jsonl; string in d.csv)" in message, message
    assert "a CSV or TSV column is read as strings (the characters of its fields): give it as strings" in message


def test_names_that_are_not_utf8_are_refused_before_anything_is_written(tiny_dir, tmp_path):
    """An input file or an OUTPUT_DIR whose name is bytes that are not UTF-8 (a file system keeps
    them; pyarrow cannot open them): exit 2 naming it, where it was a UnicodeEncodeError traceback
    (the OUTPUT_DIR's after the model loaded, its lock and job record left behind)."""
    write(tmp_path / "in" / "a.parquet", text=pa.array(TEXTS))
    bad_in = os.fsdecode(os.fsencode(str(tmp_path / "in")) + b"/b\xffd.parquet")
    shutil.copy(tmp_path / "in" / "a.parquet", bad_in)
    r = elmo("embed", "--text", tmp_path / "in", "--out", tmp_path / "out", "--model", tiny_dir)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "b\\xffd.parquet: the name is not UTF-8" in r.stderr and not (tmp_path / "out").exists()
    os.remove(bad_in)
    bad_out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/o\xff")
    r = elmo("embed", "--text", tmp_path / "in", "--out", bad_out, "--model", tiny_dir)
    assert r.returncode == 2 and "o\\xff: the name is not UTF-8 (bytes shown as \\x..); rename it" in r.stderr, r.stderr
    assert not os.path.exists(bad_out)


def test_a_column_name_twice_is_refused_naming_it(tiny_dir, tmp_path):
    """A KeyError or ArrowInvalid traceback (exit 1), for a CSV header or a Parquet file alike."""
    (tmp_path / "dup.csv").write_text("id,text,text\n1,a b,c\n")
    parquet = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([1]), pa.array(["a b"]), pa.array(["x"])], names=["id", "text", "id"]),
                   parquet)
    for path, twice in ((tmp_path / "dup.csv", "['text']"), (parquet, "['id']")):
        for fmt in (["--format", "hdf5"], []):
            out = tmp_path / ("out.hdf5" if fmt else "out")
            r = elmo("embed", "--text", path, "--out", out, "--model", tiny_dir, *fmt)
            assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
            assert f"{path}: columns {twice} appear more than once; columns are read by name" in r.stderr, r.stderr
            assert not out.exists()


@pytest.mark.parametrize("damage, message", [
    ("truncated weights", "is it truncated or of another format?"),
    ("unknown options key", "unknown key(s) ['bogus']"),
    ("int64 text column", "--text-column must be a string column, found int64"),
    ("fewer layers in the options", "are not used by options.json"),
])
def test_a_job_that_cannot_work_writes_nothing_and_runs_once_fixed(tiny_dir, tmp_path, damage, message):
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    corpus = write(tmp_path / "in" / "a.parquet", text=pa.array(TEXTS))
    if damage == "truncated weights":
        data = (model / "weights.hdf5").read_bytes()
        (model / "weights.hdf5").write_bytes(data[: len(data) // 2])
    elif damage == "unknown options key":
        (model / "options.json").write_text(json.dumps({**json.loads((model / "options.json").read_text()), "bogus": 1}))
    elif damage == "fewer layers in the options":
        options = json.loads((model / "options.json").read_text())
        options["lstm"]["n_layers"] = 1
        (model / "options.json").write_text(json.dumps(options))
    else:
        write(corpus, text=pa.array([1, 2, 3], pa.int64()))
    out = tmp_path / "out"
    r = elmo("embed", "--text", corpus, "--out", out, "--model", model)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (out / "_job.parquet").exists()
    shutil.rmtree(model)
    shutil.copytree(tiny_dir, model)
    write(corpus, text=pa.array(TEXTS))
    r = elmo("embed", "--text", corpus, "--out", out, "--model", model)  # the same command, once the cause is fixed
    assert r.returncode == 0, r.stderr


def test_an_edit_that_keeps_the_size_is_seen_on_resume(tiny_dir, tmp_path):
    corpus = write(tmp_path / "in" / "a.parquet", text=pa.array(TEXTS))
    out = tmp_path / "out"
    embed_parquet(corpus, out, tiny_dir, quiet=True, verify_inputs=True)
    stat = corpus.stat()
    write(corpus, text=pa.array([t.replace("Green", "Gxeen") for t in TEXTS]))
    assert corpus.stat().st_size == stat.st_size
    r = elmo("embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--resume")
    assert r.returncode == 2 and "another job's output (different inputs changed" in r.stderr, r.stderr
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the edit hidden from size and mtime
    r = elmo("embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--resume", "--verify-inputs")
    assert r.returncode == 2 and "input files changed since the shards were written" in r.stderr, r.stderr


def test_invalid_utf8_bytes_are_dropped_as_the_original_does_and_counted(tiny_dir, tmp_path):
    raw = [b"The cat sat .", b"lone \xed\xa0\x80surrogate here", b"fine"]  # ED A0 80: a UTF-16 surrogate
    offsets = np.cumsum([0] + [len(b) for b in raw]).astype(np.int32)
    text = pa.Array.from_buffers(pa.string(), len(raw), [None, pa.py_buffer(offsets.tobytes()),
                                                         pa.py_buffer(b"".join(raw))])
    corpus = write(tmp_path / "in" / "a.parquet", id=pa.array([0, 1, 2]), text=text)
    out = tmp_path / "out"
    r = elmo("embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--id-column", "id")
    assert r.returncode == 0, r.stderr
    assert "1 with invalid UTF-8 dropped" in r.stderr
    m = read_record(out / "_manifest.parquet")
    assert m["invalid_utf8"] == 1 and m["rows"] == 3
    got = ds.dataset(out, format="parquet").to_table().column("elmo").to_pylist()
    want = Embedder.from_files(tiny_dir).embed_sentences([b.decode("utf-8", "ignore").split() for b in raw],
                                                         output="mixed")
    for g, w in zip(got, want):
        # elmo embed's batches vs the Embedder's: fp32 sums in another order
        np.testing.assert_allclose(np.asarray(g, np.float32), w, atol=1e-5, rtol=0)


def test_published_file_names_and_weights_flag(tiny_dir, tmp_path):
    model = tmp_path / "published"
    model.mkdir()
    shutil.copy(tiny_dir / "options.json", model / "elmo_tiny_options.json")
    shutil.copy(tiny_dir / "weights.hdf5", model / "elmo_tiny_weights.hdf5")
    shutil.copy(tiny_dir / "weights.hdf5", model / "elmo_tiny_softmax_weights.hdf5")  # never taken as the biLM
    corpus = write(tmp_path / "in" / "a.parquet", text=pa.array(TEXTS))
    assert elmo("embed", "--text", corpus, "--out", tmp_path / "o1", "--model", model).returncode == 0
    shutil.copy(tiny_dir / "weights.hdf5", model / "elmo_tiny_weights_v2.hdf5")
    r = elmo("embed", "--text", corpus, "--out", tmp_path / "o2", "--model", model)
    assert r.returncode == 2 and "name the file with --weights" in r.stderr
    r = elmo("embed", "--text", corpus, "--out", tmp_path / "o2", "--model", model, "--weights", model / "elmo_tiny_weights_v2.hdf5")
    assert r.returncode == 0, r.stderr
    r = elmo("embed", "--text", corpus, "--out", tmp_path / "o3", "--model", model / "elmo_tiny_options.json",
             "--weights", model / "elmo_tiny_weights.hdf5")
    assert r.returncode == 0, r.stderr
