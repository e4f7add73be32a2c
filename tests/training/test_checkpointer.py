"""Checkpoints: K steps, stop, resume, K more == 2K steps straight; and resume refusals."""
from __future__ import annotations

import math

import pytest
import torch

from training import checkpoint as ck
from training.errors import CheckpointError
from training.optim import RECIPES
from training.trainer import train

from tests.training.train_utils import sotu_sentences, tiny_run, write_corpus

K = 6


def _final_tensors(run_dir):
    step = ck.latest_step(run_dir / "checkpoints", 1)
    tensors, meta = ck.read(ck.main_path(run_dir / "checkpoints", step))
    return step, tensors


@pytest.mark.parametrize("batching", ["packed", "stateful", "sentences"])
def test_resume_continues_exactly(tmp_path, batching):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=40))
    quiet = lambda s: None  # noqa: E731
    # The default recipe (Adam warming up, then cosine decay over a fixed horizon), dropout 0.1,
    # sampled softmax with sparse (lazy Adam) updates of its rows, shuffle buffer.
    common = dict(batching=batching, checkpoint_every=4, seed=5, lr_decay_tokens=2 * K * 8 * 10)
    train(tiny_run(tmp_path, p, out="straight", max_steps=2 * K, **common), log=quiet)
    train(tiny_run(tmp_path, p, out="split", max_steps=K, **common), log=quiet)
    train(tiny_run(tmp_path, p, out="split", max_steps=2 * K, **common), resume=True, log=quiet)
    s1, a = _final_tensors(tmp_path / "straight")
    s2, b = _final_tensors(tmp_path / "split")
    assert s1 == s2 == 2 * K and set(a) == set(b)
    assert any(k.startswith("optim.") for k in a) and "rng.sampler" in a and "softmax_opt.m_w" in a
    for name in a:
        # resume replays the same fp32 operations in the same order: equal bits (1e-6 is the bar)
        assert torch.allclose(a[name].double(), b[name].double(), rtol=0, atol=1e-6), name
    moved = (a["model.bilm.lstm.w_input"] - _initial(tmp_path, p)).abs().max()
    assert moved > 1e-4  # training did change the weights


def test_resume_with_lr_decay_continues_exactly(tmp_path):
    """The decayed lr is a function of progress only, so a resumed run follows the same schedule."""
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=40))
    quiet = lambda s: None  # noqa: E731
    common = dict(checkpoint_every=4, seed=3, optimizer="adam", lr=0.01, lr_decay="cosine", lr_final=0.1,
                  lr_decay_tokens=2 * K * 8 * 10)  # tiny options: batch 8 x unroll 10 tokens a step
    train(tiny_run(tmp_path, p, out="straight", max_steps=2 * K, **common), log=quiet)
    train(tiny_run(tmp_path, p, out="split", max_steps=K, **common), log=quiet)
    train(tiny_run(tmp_path, p, out="split", max_steps=2 * K, **common), resume=True, log=quiet)
    (_, a), (_, b) = _final_tensors(tmp_path / "straight"), _final_tensors(tmp_path / "split")
    # resume replays the same fp32 operations in the same order: equal bits (1e-6 is the bar)
    for name in a:
        assert torch.allclose(a[name].double(), b[name].double(), rtol=0, atol=1e-6), name
    meta = ck.read(ck.main_path(tmp_path / "straight" / "checkpoints", 2 * K))[1]
    last_lr = [g["lr"] for g in meta["optimizer"]["param_groups"]]
    # step 2K's lr is set at progress (2K-1)/2K of the horizon: 0.01 * warm-up * (0.1 + 0.9 * cos-shape)
    done, warm = (2 * K - 1) / (2 * K), min(1.0, 2 * K / RECIPES["default"].warmup_steps)
    expected = 0.01 * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))
    assert last_lr == [pytest.approx(expected, rel=1e-9)], (last_lr, expected)


def _initial(tmp_path, p):
    from training.trainer import Trainer

    return Trainer(tiny_run(tmp_path, p, out="init"), log=lambda s: None).lm.bilm.lstm.w_input.detach()


def test_resume_refusals(tmp_path):
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=10))
    with pytest.raises(CheckpointError, match="holds no checkpoint to resume from"):
        train(tiny_run(tmp_path, p, out="fresh", max_steps=1), resume=True, log=lambda s: None)
    assert not (tmp_path / "fresh").exists()  # refused before anything is written
    train(tiny_run(tmp_path, p, out="r", max_steps=2), log=lambda s: None)
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        train(tiny_run(tmp_path, p, out="r", max_steps=3), log=lambda s: None)
    with pytest.raises(CheckpointError, match="differ"):
        train(tiny_run(tmp_path, p, out="r", max_steps=3, batch_size=4), resume=True, log=lambda s: None)
    (tmp_path / "r" / "checkpoints" / "ckpt-00000002.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        train(tiny_run(tmp_path, p, out="r", max_steps=3), resume=True, log=lambda s: None)


def test_prune_keeps_the_newest_and_leaves_no_rank_file_without_its_main(tmp_path):
    """A kill between the unlinks of a pruned checkpoint left its rank file for good (the main file
    went first, and rank files were found through main files): rank files go first now, and one older
    than the newest checkpoint without its main file is deleted by the next prune."""
    from training.checkpoint import latest_step, main_path, prune, rank_path

    for step in (10, 20, 30, 40):
        main_path(tmp_path, step).write_bytes(b"m")
        rank_path(tmp_path, step, 0).write_bytes(b"r")
    rank_path(tmp_path, 5, 0).write_bytes(b"r")  # an earlier prune killed after its main file went
    main_path(tmp_path, 10).unlink()
    prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-00000030.rank0.safetensors", "ckpt-00000030.safetensors",
        "ckpt-00000040.rank0.safetensors", "ckpt-00000040.safetensors"]
    rank_path(tmp_path, 50, 0).write_bytes(b"r")  # the next checkpoint's rank file, its main not yet written
    prune(tmp_path, keep=2)
    assert rank_path(tmp_path, 50, 0).is_file() and latest_step(tmp_path, 1) == 40
