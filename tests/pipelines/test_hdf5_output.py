"""``elmo embed --format hdf5``: the file ``allennlp elmo`` writes, checked against the real command
(AllenNLP 0.9.0 in a side venv, scripts/setup_allennlp09.sh) and against the Embedder."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from elmo_cli.main import main
from elmo_core.errors import InputError
from inference import Embedder
from pipelines.hdf5_output import embed_to_hdf5

PEER = Path("/tmp/peer-allennlp09/bin/allennlp")
ATOL = 1e-5
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
        assert main(["embed", str(source), str(ours), "--format", "hdf5", "--output", flag[2:], "--model", str(model),
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


def test_parquet_input_and_sentence_keys(tiny_dir, tmp_path):
    pq.write_table(pa.table({"text": ["a b c", None, "  d e  ", ""]}), tmp_path / "in.parquet")
    out = tmp_path / "out.hdf5"
    assert main(["embed", str(tmp_path / "in.parquet"), str(out), "--format", "hdf5", "--output", "top",
                 "--model", str(tiny_dir), "--quiet"]) == 0
    got = read(out)
    assert [got[str(i)][2][0] for i in range(4)] == [3, 0, 2, 0]  # null and empty rows: zero tokens, kept
    assert json.loads(got["sentence_to_index"][0][0]) == {"a b c": "0", "": "3", "d e": "2"}
    keyed = tmp_path / "keyed.hdf5"
    pq.write_table(pa.table({"text": ["a b c", "d e"]}), tmp_path / "two.parquet")
    embed_to_hdf5(tmp_path / "two.parquet", keyed, tiny_dir, use_sentence_keys=True, quiet=True)
    assert sorted(read(keyed)) == ["a b c", "d e"]


def test_bad_input_is_named_and_leaves_no_file(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out.hdf5"
    out.write_bytes(b"an earlier result")
    cases = [
        ("a b\n\nc d\n", [], "line 2 is empty"),
        ("a b\nc d\na b\n", ["--use-sentence-keys"], "sentence 2 repeats sentence 0"),
        ("a/b c\n", ["--use-sentence-keys"], "cannot be an hdf5 dataset name"),
        ("a b\n", ["--pool", "mean"], "no place for --pool"),
    ]
    for text, extra, message in cases:
        (tmp_path / "in.txt").write_text(text)
        assert main(["embed", str(tmp_path / "in.txt"), str(out), "--format", "hdf5", "--model", str(tiny_dir),
                     "--quiet", *extra]) == 2
        assert message in capsys.readouterr().err
        assert out.read_bytes() == b"an earlier result"  # untouched: written only as a whole
        assert not list(tmp_path.glob(".*.tmp"))
    assert main(["embed", str(tmp_path / "in.txt"), str(out), "--model", str(tiny_dir)]) == 2
    assert "add --format hdf5" in capsys.readouterr().err
    with pytest.raises(InputError, match="is a directory"):
        embed_to_hdf5(tmp_path / "in.txt", tmp_path, tiny_dir)
