"""The fused training recurrence (LstmSequence) against autograd over ``lstm_step``."""
from __future__ import annotations

import pytest
import torch

from elmo_core import batch_to_ids
from elmo_core.lstm import BiLstmStack, Packing
from elmo_core.lstm_cell import lstm_step
from elmo_core.lstm_sequence import lstm_sequence
from formats import load_bilm

from tests.helpers import SENTENCES


def _autograd_layer(gx, h, c, w_state, w_proj, steps, shared_first, cell_clip, proj_clip):
    """The plain per-step loop that autograd differentiates (BiLstmStack's generic path)."""
    B, outs = h.shape[1], []
    for start, n in steps:
        h_new, c_new = lstm_step(torch.baddbmm(gx[:, start : start + n], h[:, :n], w_state), c[:, :n],
                                 w_proj, cell_clip, proj_clip)
        outs.append(h_new)
        if n == B or shared_first and start == 0:
            h, c = h_new.expand_as(h), c_new.expand_as(c)
        else:
            h, c = torch.cat([h_new, h[:, n:]], 1), torch.cat([c_new, c[:, n:]], 1)
    return torch.cat(outs, 1), h, c


@pytest.mark.parametrize("lengths,shared", [([6, 6, 6], False), ([5, 3, 3, 1], False), ([6, 4, 2], True)])
@pytest.mark.parametrize("clips", [(None, None), (1.0, 0.8)])
def test_values_and_gradients_match_autograd(lengths, shared, clips):
    g = torch.Generator().manual_seed(len(lengths))
    pack = Packing(torch.tensor(lengths), max(lengths), shared_first=shared)
    D, P, C, B, N = 2, 5, 7, len(lengths), sum(n for _, n in pack.steps)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()

    inputs = [rand(D, N, 4 * C, scale=2.0), rand(D, B, P), rand(D, B, C, scale=2.0), rand(D, P, 4 * C), rand(D, C, P)]
    want = _autograd_layer(*inputs, pack.steps, shared, *clips)
    got = lstm_sequence(*inputs, pack.steps, shared, *clips)
    if clips[0] is not None:  # the clips must really be active for the test to mean anything
        assert float(want[0].detach().abs().max()) == pytest.approx(clips[1])
    weights = [torch.randn(x.shape, generator=g, dtype=torch.float64) for x in want]
    grads_want = torch.autograd.grad(sum((x * w).sum() for x, w in zip(want, weights)), inputs)
    grads_got = torch.autograd.grad(sum((x * w).sum() for x, w in zip(got, weights)), inputs)
    for a, b in zip(want, got):
        # float64: the fused recurrence reorders sums only, ~1e-16 relative
        torch.testing.assert_close(b, a, atol=1e-12, rtol=0)
    for name, a, b in zip(("gx", "h0", "c0", "w_state", "w_proj"), grads_want, grads_got):
        torch.testing.assert_close(b, a, atol=1e-12, rtol=1e-12, msg=lambda m: f"d/d{name}: {m}")


def test_the_bilm_trains_through_it_with_the_same_gradients(tiny_dir, monkeypatch):
    """The whole biLM in training mode: the recurrence as one function vs autograd over its steps."""
    ids = torch.from_numpy(batch_to_ids(SENTENCES))

    def grads():
        torch.manual_seed(0)  # the same dropout masks in both runs
        model = load_bilm(tiny_dir).double().train()
        model.run(ids.clone()).layers.pow(2).sum().backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    fused = grads()
    monkeypatch.setattr(BiLstmStack, "sequence", staticmethod(lambda *a: _autograd_layer(*a[:-1])))  # a[-1]: no autocast
    generic = grads()
    assert set(fused) == set(generic) and "lstm.w_state" in fused
    for k in fused:
        # float64 gradients through T steps: reordered sums, amplified by the recurrence
        torch.testing.assert_close(fused[k], generic[k], atol=1e-10, rtol=1e-10, msg=lambda m: f"{k}: {m}")


def test_under_autocast_the_fused_recurrence_runs_its_products_in_bf16(tiny_dir, monkeypatch):
    """``elmo train --bf16``: the fused recurrence (not the per-step cell) with bf16 products; its
    outputs and gradients stay fp32 and close to the fp32 ones."""
    ids = torch.from_numpy(batch_to_ids(SENTENCES))
    seen = []

    def spy(*args):
        seen.append(args[-1])
        return lstm_sequence(*args)

    monkeypatch.setattr(BiLstmStack, "sequence", staticmethod(spy))

    def run(autocast: bool):
        model = load_bilm(tiny_dir).eval()  # no dropout: the two runs differ only in precision
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            layers = model.run(ids.clone()).layers
        layers.pow(2).sum().backward()
        return layers.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    want, want_grads = run(False)
    got, got_grads = run(True)
    assert seen == [None] * 2 + [torch.bfloat16] * 2  # two layers per run: fp32, then bf16
    assert got.dtype == torch.float32 and got_grads["lstm.w_state"].dtype == torch.float32
    cos = torch.nn.functional.cosine_similarity(got.flatten(0, 2), want.flatten(0, 2), dim=-1)
    assert cos[want.flatten(0, 2).norm(dim=-1) > 0].min() >= 0.999
    assert (got - want).abs().max() > 1e-5  # the products really ran in bf16
    for k in ("lstm.w_state", "lstm.w_proj", "lstm.w_input", "lstm.bias"):
        c = torch.nn.functional.cosine_similarity(got_grads[k].flatten(), want_grads[k].flatten(), dim=0)
        assert c >= 0.99, (k, float(c))
