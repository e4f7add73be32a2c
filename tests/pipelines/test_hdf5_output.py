"""``elmo embed --format hdf5``: the file ``allennlp elmo`` writes, checked against the real command
(AllenNLP 0.9.0 in a side venv, scripts/setup_allennlp09.sh) and against the Embedder."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from elmo_cli.main import main
from elmo_core.errors import InputError
from inference import Embedder
from pipelines.hdf5_output import WRITER_ATTR, embed_to_hdf5
from tests.processes import WAIT_S, wait_until

PEER = Path("/tmp/peer-allennlp09/bin/allennlp")
ATOL = 1e-5  # float32 vs allennlp's float32 LSTM (other kernels), or the same engine in other batches
LINES = ["The cat sat on the mat .", "Hello   world", "The cat sat on the mat .", "Café 日本語 naïve x" + "y" * 60,
         "A much longer sentence , with punctuation and numbers like 1 , 2 and 1790 in it ."]


def read(path: Path) -> dict:
    with h5py.File(path) as f:
        return {k: (f[k][()], f[k].dtype, f[k].shape) for k in f}


@pytest.mark.slow
def test_same_file_as_allennlp_elmo(fixture_model, tmp_path):
    model = fixture_model
    if not PEER.is_file():
        pytest.skip(f"AllenNLP 0.9.0 side venv absent ({PEER}); build it with scripts/setup_allennlp09.sh")
    text = tmp_path / "in.txt"
    text.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    unique = tmp_path / "unique.txt"
    unique.write_text("\n".join(LINES[:2] + LINES[3:]) + "\n", encoding="utf-8")
    # All lines fit allennlp's first batch of 64, which starts from a zero LSTM state: what our
    # stateless biLM computes for every sentence.
    for flag, source, extra in [("--all", text, []), ("--top", text, []), ("--average", text, []),
                                ("--all", unique, ["--use-sentence-keys"])]:
        theirs, ours = tmp_path / f"theirs{flag}{len(extra)}.hdf5", tmp_path / f"ours{flag}{len(extra)}.hdf5"
        subprocess.run([str(PEER), "elmo", str(source), str(theirs), flag, "--options-file", str(model / "options.json"),
                        "--weight-file", str(model / "weights.hdf5"), "--cuda-device", "-1", *extra],
                       check=True, capture_output=True, timeout=300, cwd=tmp_path)
        assert main(["embed", "--text", str(source), "--out", str(ours), "--format", "hdf5", "--output", flag[2:], "--model", str(model),
                     "--quiet", *extra]) == 0
        a, b = read(theirs), read(ours)
        assert sorted(a) == sorted(b), flag
        for key, (value, dtype, shape) in a.items():
            assert (b[key][1], b[key][2]) == (dtype, shape), f"{flag} {key}"
            if key == "sentence_to_index":
                assert b[key][0][0] == value[0]  # the same JSON text, byte for byte
            else:
                np.testing.assert_allclose(b[key][0], value, atol=ATOL, rtol=0, err_msg=f"{flag} {key}")


def test_layout_and_values(tiny_dir, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    emb = Embedder.open(tiny_dir)
    for output in ("all", "top", "average", "mixed"):
        out = tmp_path / f"{output}.hdf5"
        embed_to_hdf5(text, out, tiny_dir, output=output, mix=(0.5, -1.0, 2.0) if output == "mixed" else None,
                      gamma=1.5 if output == "mixed" else 1.0, sort_window_rows=2, quiet=True)  # streamed in 3 chunks
        got = read(out)
        want = emb.embed_sentences([s.split() for s in LINES], output=output,
                                   mix_weights=[0.5, -1.0, 2.0] if output == "mixed" else None,
                                   gamma=1.5 if output == "mixed" else 1.0)
        assert sorted(got) == sorted([str(i) for i in range(len(LINES))] + ["sentence_to_index"])
        for i, w in enumerate(want):
            assert got[str(i)][1] == np.float32
            np.testing.assert_allclose(got[str(i)][0], w, atol=ATOL, rtol=0, err_msg=f"{output} {i}")
        index = json.loads(got["sentence_to_index"][0][0])
        assert index == {LINES[0]: "2", LINES[1]: "1", LINES[3]: "3", LINES[4]: "4"}  # stripped lines; last index wins
    assert not list(tmp_path.glob(".*"))  # a finished job keeps no lock file (nor a temporary)


def test_parquet_input_and_sentence_keys(tiny_dir, tmp_path):
    pq.write_table(pa.table({"text": ["a b c", None, "  d e  ", ""]}), tmp_path / "in.parquet")
    out = tmp_path / "out.hdf5"
    assert main(["embed", "--text", str(tmp_path / "in.parquet"), "--out", str(out), "--format", "hdf5", "--output", "top",
                 "--model", str(tiny_dir), "--quiet"]) == 0
    got = read(out)
    assert [got[str(i)][2][0] for i in range(4)] == [3, 0, 2, 0]  # null and empty rows: zero tokens, kept
    assert json.loads(got["sentence_to_index"][0][0]) == {"a b c": "0", "": "3", "d e": "2"}
    keyed = tmp_path / "keyed.hdf5"
    pq.write_table(pa.table({"text": ["a b c", "d e"]}), tmp_path / "two.parquet")
    embed_to_hdf5(tmp_path / "two.parquet", keyed, tiny_dir, use_sentence_keys=True, quiet=True)
    assert sorted(read(keyed)) == ["a b c", "d e"]


def test_a_null_row_is_marked_apart_from_an_empty_one_and_both_are_counted(tiny_dir, tmp_path, capsys):
    """Both are (T=0, D) datasets, as allennlp's empty sentence; a null row's carries the attribute
    ``null`` (as the Parquet output's null vectors differ from an empty list), an empty row's none."""
    pq.write_table(pa.table({"text": ["a b c", None, "  ", "", None]}), tmp_path / "in.parquet")
    out = tmp_path / "out.hdf5"
    assert main(["embed", "--text", str(tmp_path / "in.parquet"), "--out", str(out), "--format", "hdf5", "--output",
                 "all", "--model", str(tiny_dir), "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert (result["sentences"], result["null_rows"], result["empty_rows"], result["tokens"]) == (5, 2, 2, 3)
    assert "5 sentences, 3 tokens (2 null, 2 empty)" in captured.err
    with h5py.File(out) as f:
        assert [f[str(i)].shape[1] for i in range(5)] == [3, 0, 0, 0, 0]
        assert [dict(f[str(i)].attrs) for i in range(5)] == [{}, {"null": True}, {}, {}, {"null": True}]
    tokens = tmp_path / "tokens.parquet"
    pq.write_table(pa.table({"tokens": [["a"], None, []]}), tokens)
    result = embed_to_hdf5(tokens, out, tiny_dir, tokens_column="tokens", quiet=True)
    assert (result["null_rows"], result["empty_rows"]) == (1, 1)
    with h5py.File(out) as f:
        assert [bool(f[str(i)].attrs.get("null", False)) for i in range(3)] == [False, True, False]


def test_bad_input_is_named_and_leaves_no_file(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out.hdf5"
    with h5py.File(out, "w") as f:  # an earlier result (marked as one: only such a file is replaced)
        f["0"] = np.zeros((1, 4), np.float32)
        f.attrs[WRITER_ATTR] = "{}"
    earlier = out.read_bytes()
    cases = [
        ("a b\n\nc d\n", [], "line 2 is empty"),
        ("a b\nc d\na b\n", ["--use-sentence-keys"], "line 3 repeats"),
        ("a/b c\n", ["--use-sentence-keys"], "cannot be an hdf5 dataset name"),
        ("a b\n", ["--pool", "mean"], "no place for --pool"),
        ("a b\n", ["--output", "default"], "no place for --pool (or --output default: TF-Hub's name"),
    ]
    for text, extra, message in cases:
        (tmp_path / "in.txt").write_text(text)
        assert main(["embed", "--text", str(tmp_path / "in.txt"), "--out", str(out), "--format", "hdf5", "--model", str(tiny_dir),
                     "--quiet", *extra]) == 2
        assert message in capsys.readouterr().err
        assert out.read_bytes() == earlier  # untouched: written only as a whole
        assert not list(tmp_path.glob(".*.tmp"))
    assert main(["embed", "--text", str(tmp_path / "in.txt"), "--out", str(out), "--model", str(tiny_dir)]) == 2
    assert "add --format hdf5" in capsys.readouterr().err
    with pytest.raises(InputError, match="is a directory"):
        embed_to_hdf5(tmp_path / "in.txt", tmp_path, tiny_dir)


def _invalid_utf8_texts(raw: list[bytes | None]) -> pa.Array:
    """A string column holding bytes that are not UTF-8 (Arrow does not check what it reads)."""
    data = [b or b"" for b in raw]
    offsets = np.cumsum([0] + [len(b) for b in data]).astype(np.int32)
    validity = pa.array([b is not None for b in raw]).buffers()[1]
    return pa.Array.from_buffers(pa.string(), len(raw), [validity, pa.py_buffer(offsets.tobytes()),
                                                         pa.py_buffer(b"".join(data))])


def test_parquet_rows_get_the_parquet_outputs_handling(tiny_dir, tmp_path, capsys):
    raw = [b"The cat sat .", b"lone \xed\xa0\x80surrogate here", None, b"   ", b"x\x00y", b"x\x00z"]
    pq.write_table(pa.table({"text": _invalid_utf8_texts(raw)}), tmp_path / "in.parquet")
    out = tmp_path / "out.hdf5"
    assert main(["embed", "--text", str(tmp_path / "in.parquet"), "--out", str(out), "--format", "hdf5", "--model", str(tiny_dir),
                 "--json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["invalid_utf8"] == 1 and result["sentences"] == 6
    texts = [None if b is None else b.decode("utf-8", "ignore") for b in raw]
    want = Embedder.from_files(tiny_dir).embed_sentences([(t or "").split() for t in texts], output="mixed")
    got = read(out)
    for i, w in enumerate(want):
        assert got[str(i)][2] == w.shape  # null and blank rows: (0, D), as allennlp's empty sentence
        np.testing.assert_allclose(got[str(i)][0], w, atol=ATOL, rtol=0)
    for rows, message in [([b"a b", None], "row 1 (column 'text'): the sentence is null"),
                          ([b"a b", b" \t "], "row 1 (column 'text'): the sentence is empty"),
                          ([b"x\x00y", b"x\x00z"], "cannot be an hdf5 dataset name ('/' separates groups, NUL")]:
        pq.write_table(pa.table({"text": _invalid_utf8_texts(rows)}), tmp_path / "in.parquet")
        assert main(["embed", "--text", str(tmp_path / "in.parquet"), "--out", str(out), "--format", "hdf5", "--model", str(tiny_dir),
                     "--use-sentence-keys", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and f"{tmp_path / 'in.parquet'}: row" in err, err
        assert read(out)["0"][2][0] == 4  # the earlier result ("The cat sat ."), untouched


def test_a_second_job_on_the_same_file_is_refused_while_the_first_finishes(tiny_dir, tmp_path, capsys, spawn):
    lines = [" ".join(f"w{(i * 7 + k) % 97}" for k in range(5 + i % 30)) for i in range(6000)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.hdf5"
    first = spawn([sys.executable, "-m", "elmo_cli", "embed", "--text", str(tmp_path / "in.txt"), "--out", str(out),
                   "--format", "hdf5", "--model", str(tiny_dir), "--quiet"], stderr=subprocess.PIPE, text=True)
    lock = tmp_path / ".out.hdf5.lock"
    # the holder's record: written once locked
    wait_until(lambda: lock.is_file() and lock.read_text().strip(), "the first job took the lock", proc=first)
    assert main(["embed", "--text", str(tmp_path / "in.txt"), "--out", str(out), "--format", "hdf5", "--model", str(tiny_dir),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{out} is in use by another elmo embed job (pid {first.pid}" in err, err
    assert first.poll() is None, "the first job ended before the second tried: make it longer"
    assert first.wait(timeout=2 * WAIT_S) == 0, first.stderr.read()
    with h5py.File(out) as f:
        assert len(f) == len(lines) + 1 and f[str(len(lines) - 1)].shape == (len(lines[-1].split()), 16)
    assert not list(tmp_path.glob(".*.tmp"))  # neither job left a temporary file
    assert not lock.exists()  # nor its lock file


def test_the_token_budget_and_windows_apply(tiny_dir, tmp_path, monkeypatch):
    from inference.backends import TorchBackend

    shapes: list[tuple[int, int]] = []
    real = TorchBackend.submit

    def spy(self, ids, request, keep=None, **kwargs):  # the backend's side: every model batch the engine gives it
        shapes.append(ids.shape[:2])
        return real(self, ids, request, keep, **kwargs)

    monkeypatch.setattr(TorchBackend, "submit", spy)
    long = " ".join(f"t{k}" for k in range(70))
    (tmp_path / "in.txt").write_text("\n".join([long] + LINES) + "\n")
    embed_to_hdf5(tmp_path / "in.txt", tmp_path / "out.hdf5", tiny_dir, quiet=True, max_tokens_per_batch=48,
                  max_sentence_length=24, window_context=4)
    assert shapes and all(b * (t - 2) <= 48 and t - 2 <= 24 for b, t in shapes), shapes  # T counts <S>, </S>
    got = read(tmp_path / "out.hdf5")
    assert got["0"][2] == (70, 16)
    first = Embedder.from_files(tiny_dir).embed_sentences([long.split()[:24]], output="mixed")[0]
    np.testing.assert_allclose(got["0"][0][:20], first[:20], atol=ATOL, rtol=0)  # window 1: 24 tokens, 20 kept
