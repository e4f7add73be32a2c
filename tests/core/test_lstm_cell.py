"""The inference cell (``lstm_step_inplace``) against the reference ``lstm_step``."""
from __future__ import annotations

import pytest
import torch

from elmo_core.lstm_cell import lstm_step
from inference.fast_lstm import lstm_step_inplace


@pytest.mark.parametrize("clips", [(None, None), (0.5, 0.05)])  # tight clips: both clamp some values
def test_inplace_step_equals_the_reference(clips):
    g = torch.Generator().manual_seed(0)
    D, N, C, P = 2, 5, 16, 4
    gates = torch.randn(D, N, 4 * C, generator=g, dtype=torch.float64) * 2  # (D, N, 4C)
    c_prev = torch.randn(D, N, C, generator=g, dtype=torch.float64)  # (D, N, C)
    w_proj = torch.randn(D, C, P, generator=g, dtype=torch.float64)  # (D, C, P)
    h_ref, c_ref = lstm_step(gates, c_prev, w_proj, *clips)
    state = c_prev.clone()
    h, c = lstm_step_inplace(gates.clone(), state, lambda m: torch.bmm(m, w_proj), *clips)
    assert c is state  # updated in the caller's buffer
    # float64 cell: reordered sums only
    torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-12)
    if clips[0] is not None:
        assert c_ref.abs().max() == clips[0] and h_ref.abs().max() == clips[1]  # the clips were exercised
