"""``elmo train --init-from``: continue pretraining the TF reference fixture model with a written
softmax; the first step's loss is the loaded model's, resume is exact, an extended vocabulary
keeps the old softmax rows bit for bit, bad softmax files are named."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmo_cli.main import main as cli
from formats import load_bilm
from training import checkpoint as ck
from training.errors import TrainingError
from training.init_from import read_softmax
from training.model import LanguageModel
from training.trainer import Trainer, TrainOptions, train
from training.vocab import Vocab

from tests.training.train_utils import sotu_sentences, write_corpus

QUIET = lambda s: None  # noqa: E731


@pytest.fixture
def source(fixture_dir: Path, tmp_path: Path) -> Path:
    """The fixture model with a random softmax over its vocabulary; training keys for a tiny run."""
    model = tmp_path / "source"
    model.mkdir()
    options = json.loads((fixture_dir / "options.json").read_text())
    options.update(dropout=0.0, batch_size=4, unroll_steps=8, n_negative_samples_batch=64)  # training keys only
    (model / "options.json").write_text(json.dumps(options))
    shutil.copy(fixture_dir / "lm_weights.hdf5", model / "weights.hdf5")
    shutil.copy(fixture_dir / "vocab_test.txt", model / "vocab.txt")
    rng = np.random.default_rng(0)
    with h5py.File(model / "softmax.hdf5", "w") as f:
        f["softmax/W"] = rng.normal(0, 0.3, (458, 16)).astype(np.float32)
        f["softmax/b"] = rng.normal(0, 0.3, 458).astype(np.float32)
    return model


def _opts(tmp_path: Path, source: Path, out: str, **kw) -> TrainOptions:
    corpus = write_corpus(tmp_path / "domain.txt", sotu_sentences(limit=60))
    base = dict(train=str(corpus), options=None, out=str(tmp_path / out), init_from=str(source), seed=1,
                checkpoint_every=0, log_every=1000, threads=1, shuffle_buffer=20, min_count=2)
    return TrainOptions(**{**base, **kw})


def test_first_step_loss_is_the_loaded_models(source, tmp_path):
    trainer = Trainer(_opts(tmp_path, source, "run", lr=0.0), QUIET)
    batch = trainer.batcher.next_batch()
    trainer.sampler = None  # the full softmax on both sides: an exact comparison
    sums, n = trainer.train_step(batch)
    direct = LanguageModel(trainer.config, 458)
    with torch.no_grad():
        direct.bilm.load_state_dict(load_bilm(source).state_dict())
        W, b = read_softmax(source / "softmax.hdf5", 458, 16, source / "vocab.txt")
        direct.softmax_w.copy_(torch.from_numpy(W))
        direct.softmax_b.copy_(torch.from_numpy(b))
        _, want, _ = direct.eval()(batch.chars, batch.targets, batch.mask)
    # fp32 sums of a batch's losses in two orders: ~sqrt(N) ulp relative
    np.testing.assert_allclose(sums.numpy(), want.numpy(), rtol=1e-5)
    assert 3.0 < float(sums.sum()) / (2 * n) < 12.0  # a real loss over a 458-word softmax, not a constant


def test_fine_tuning_resumes_exactly(source, tmp_path):
    common = dict(checkpoint_every=3, extend_vocab=True, optimizer="adam", lr=0.01,  # sampled softmax (64 of V)
                  lr_decay="none")  # a constant lr: the runs stop at different --max-steps
    train(_opts(tmp_path, source, "straight", max_steps=6, **common), log=QUIET)
    train(_opts(tmp_path, source, "split", max_steps=3, **common), log=QUIET)
    train(_opts(tmp_path, source, "split", max_steps=6, **common), resume=True, log=QUIET)
    a, _ = ck.read(ck.main_path(tmp_path / "straight" / "checkpoints", 6))
    b, _ = ck.read(ck.main_path(tmp_path / "split" / "checkpoints", 6))
    assert set(a) == set(b) and "rng.sampler" in a
    for name in a:
        # the same fp32 operations in the same order: equal bits (the margin is for the 1e-6 bar)
        assert torch.allclose(a[name].double(), b[name].double(), rtol=0, atol=1e-6), name
    start = load_bilm(source).lstm.w_input
    assert (a["model.bilm.lstm.w_input"] - start).abs().max() > 1e-4  # it did train
    assert (tmp_path / "straight" / "model" / "weights.hdf5").is_file()  # written in the published layout


def test_extended_vocabulary_keeps_old_rows(source, tmp_path):
    trainer = Trainer(_opts(tmp_path, source, "run", extend_vocab=True), QUIET)
    old = Vocab.load(source / "vocab.txt")
    vocab = trainer.vocab
    n_new = len(vocab) - len(old)
    assert vocab.tokens[: len(old)] == old.tokens and n_new > 10
    assert all(t not in old.index for t in vocab.tokens[len(old):])
    W, b = read_softmax(source / "softmax.hdf5", 458, 16, source / "vocab.txt")
    assert torch.equal(trainer.lm.softmax_w[:458].detach(), torch.from_numpy(W))  # bit for bit
    assert torch.equal(trainer.lm.softmax_b[:458].detach(), torch.from_numpy(b))
    unk = old.unk
    assert torch.equal(trainer.lm.softmax_w[458:].detach(), torch.from_numpy(W[unk]).expand(n_new, 16))
    # one fp32 subtraction of a float64 log: one rounding
    np.testing.assert_allclose(trainer.lm.softmax_b[458:].detach().numpy(), b[unk] - math.log(n_new), rtol=1e-6)
    assert Vocab.load(tmp_path / "run" / "vocab.txt").tokens == vocab.tokens


def test_frozen_encoder_steps_train_only_the_softmax(source, tmp_path):
    (source / "softmax.hdf5").unlink()  # a fresh softmax
    train(_opts(tmp_path, source, "frozen", max_steps=2, freeze_encoder_steps=2, checkpoint_every=2), log=QUIET)
    tensors, _ = ck.read(ck.main_path(tmp_path / "frozen" / "checkpoints", 2))
    start = load_bilm(source).state_dict()
    for name, value in start.items():
        assert torch.equal(tensors[f"model.bilm.{name}"], value), name
    fresh = LanguageModel(load_bilm(source).config, 458).initialise(1)
    assert not torch.equal(tensors["model.softmax_w"], fresh.softmax_w.detach())


def test_bad_softmax_and_options_are_named(source, tmp_path, capsys):
    with h5py.File(source / "softmax.hdf5", "w") as f:
        f["softmax/W"] = np.zeros((400, 16), np.float32)
        f["softmax/b"] = np.zeros(400, np.float32)
    with pytest.raises(TrainingError, match=r"softmax.hdf5: softmax/W is \(400, 16\).*vocab.txt has 458 words.*"
                                            r"projection is 16"):
        Trainer(_opts(tmp_path, source, "bad"), QUIET)
    corpus = tmp_path / "domain.txt"
    assert cli(["train", "--text", str(corpus), "--out", str(tmp_path / "x"), "--init-from", str(source),
                "--options", str(source / "options.json"), "--max-steps", "1"]) == 2
    assert "--options and --init-from both name an architecture" in capsys.readouterr().err
    (source / "vocab.txt").unlink()
    assert cli(["train", "--text", str(corpus), "--out", str(tmp_path / "y"), "--init-from", str(source),
                "--max-steps", "1"]) == 2
    assert "pass the model's vocabulary with --vocab FILE" in capsys.readouterr().err
