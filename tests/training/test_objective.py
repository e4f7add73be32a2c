"""Accidental hits (a row's label among the sampled candidates) get -FLOAT_MAX, as TF's
compute_accidental_hits does, found on the device without reading where they are."""
from __future__ import annotations

import torch

from training.objective import _remove_accidental_hits


def test_accidental_hits_are_masked_and_nothing_else() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, 16, generator=g, requires_grad=True)
    ids = torch.randperm(50, generator=g)[:16]  # distinct candidates
    targets = torch.randint(0, 50, (40,), generator=g)
    out = _remove_accidental_hits(logits, targets, ids, 50)
    hit = targets[:, None] == ids[None, :]  # (N, S) the plain comparison
    assert hit.any() and not hit.all()
    expected = torch.where(hit, torch.finfo(torch.float32).min, logits.detach())
    assert torch.equal(out.detach(), expected)
    out.sum().backward()
    assert torch.equal(logits.grad, (~hit).float())
