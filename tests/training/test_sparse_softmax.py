"""Sparse softmax updates against the dense optimizers they stand for, and in the trainer."""
from __future__ import annotations

import torch
from torch import nn

from training.objective import Candidates
from training.sparse_softmax import SparseSoftmax
from training.trainer import Trainer

from tests.training.train_utils import sotu_sentences, tiny_run, write_corpus

V, P = 50, 6


def _params(seed: int) -> tuple[nn.Parameter, nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return nn.Parameter(torch.randn(V, P, generator=g)), nn.Parameter(torch.randn(V, generator=g))


def _sparse_step(sparse: SparseSoftmax, ids: torch.Tensor, gw: torch.Tensor, gb: torch.Tensor, lr: float):
    rows = sparse.gather(ids, (Candidates(ids[:1], 1), Candidates(ids[:1], 1)))
    assert torch.equal(rows.ids, ids)
    rows.w.grad, rows.b.grad = gw, gb
    sparse.step(rows, lr)


def _random_steps(n: int, every_row: bool):
    g = torch.Generator().manual_seed(3)
    for _ in range(n):
        ids = torch.arange(V) if every_row else torch.randperm(V, generator=g)[:12].sort().values
        yield ids, torch.randn(ids.numel(), P, generator=g), torch.randn(ids.numel(), generator=g)


def _dense_grads(w, b, ids, gw, gb):
    w.grad, b.grad = torch.zeros_like(w), torch.zeros_like(b)
    w.grad[ids], b.grad[ids] = gw, gb


def test_sparse_adagrad_is_dense_adagrad_bit_for_bit():
    (w, b), (w2, b2) = _params(0), _params(0)
    sparse = SparseSoftmax(w, b, "adagrad")
    dense = torch.optim.Adagrad([w2, b2], lr=0.2, initial_accumulator_value=1.0)
    for ids, gw, gb in _random_steps(5, every_row=False):
        _sparse_step(sparse, ids, gw, gb, 0.2)
        _dense_grads(w2, b2, ids, gw, gb)
        dense.step()
    assert torch.equal(w, w2) and torch.equal(b, b2)
    assert torch.equal(sparse.state["sum_w"], dense.state[w2]["sum"])


def test_lazy_adam_is_adam_on_rows_read_every_step():
    (w, b), (w2, b2) = _params(1), _params(1)
    sparse = SparseSoftmax(w, b, "adam")
    dense = torch.optim.Adam([w2, b2], lr=0.01)
    for ids, gw, gb in _random_steps(4, every_row=True):
        _sparse_step(sparse, ids, gw, gb, 0.01)
        _dense_grads(w2, b2, ids, gw, gb)
        dense.step()
    # the same fp32 update applied to the touched rows only: a couple of ulp at |w| <~ 0.5
    torch.testing.assert_close(w, w2, rtol=0, atol=1e-7)
    torch.testing.assert_close(b, b2, rtol=0, atol=1e-7)


def test_lazy_adam_matches_sparse_adam_and_leaves_other_rows_alone():
    (w, b), (w2, _) = _params(2), _params(2)
    start = w.detach().clone()
    sparse = SparseSoftmax(w, b, "adam")
    ref = torch.optim.SparseAdam([w2], lr=0.01)
    seen = torch.zeros(V, dtype=torch.bool)
    for ids, gw, gb in _random_steps(4, every_row=False):
        _sparse_step(sparse, ids, gw, gb, 0.01)
        w2.grad = torch.sparse_coo_tensor(ids[None], gw, (V, P))
        ref.step()
        seen[ids] = True
    # SparseAdam adds eps before the bias correction, torch.optim.Adam (and we) after it: for a row
    # first read at step t with a small gradient that is a relative change near eps / sqrt(v)
    torch.testing.assert_close(w, w2, rtol=0, atol=2e-5)
    assert torch.equal(w[~seen], start[~seen]) and (w[seen] != start[seen]).all()


def _train(tmp_path, out: str, updates: str, steps: int = 6) -> Trainer:
    p = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=60))
    trainer = Trainer(tiny_run(tmp_path, p, out=out, recipe="bilm-tf", softmax_updates=updates), log=lambda s: None)
    for _ in range(steps):
        trainer.train_step(trainer.batcher.next_batch())
        trainer.progress.step += 1
    return trainer


def test_trainer_sparse_updates_equal_dense_adagrad(tmp_path):
    """The original's recipe: Adagrad on the sampled softmax's rows only gives the dense run's model."""
    sparse, dense = _train(tmp_path, "sparse", "sparse"), _train(tmp_path, "dense", "dense")
    assert sparse.sampler is not None and sparse.sparse is not None and dense.sparse is None
    assert sparse.lm.softmax_w.grad is None  # no (V, P) gradient is ever built
    a, b = sparse.lm.state_dict(), dense.lm.state_dict()
    for name in a:
        # fp32 training steps whose sums run in other orders; the difference grows with the steps
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)
    assert (a["softmax_w"] != _train(tmp_path, "none", "sparse", steps=0).lm.softmax_w).any()
