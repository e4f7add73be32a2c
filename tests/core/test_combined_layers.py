"""``BiLM.run_combined`` (layers combined while packed, unpacked once) against the reference:
``ScalarMix`` over the layers ``BiLM.run`` returns."""
from __future__ import annotations

import pytest
import torch

from elmo_core import ScalarMix, batch_to_ids

from formats import load_bilm
from tests.helpers import SENTENCES, make_model_dir, tiny_options


@pytest.mark.parametrize("options", [{}, {"lstm__use_skip_connections": False, "lstm__n_layers": 3}])
@pytest.mark.parametrize("kind", ["top", "average", "mixed"])
def test_combined_layers_equal_the_scalar_mix_of_the_layers(tmp_path, options, kind):
    model = load_bilm(make_model_dir(tmp_path / "m", tiny_options(**options), lstm_scale=3.0))
    ids = torch.from_numpy(batch_to_ids(SENTENCES + [[], ["One"]]))  # an empty and a one-token row too
    L1 = model.config.n_output_layers
    s, gamma = torch.linspace(-1.0, 2.0, L1), 1.7
    with torch.no_grad():
        out = model.run(ids)
        m = out.mask[:, :, None].float()
        if kind == "mixed":
            mix = ScalarMix(L1, s.tolist(), gamma)
            ref, weights = mix(out.layers, out.mask) * m, gamma * mix.normalized_weights()
        elif kind == "top":
            ref, weights = out.layers[:, -1], torch.eye(L1)[-1]
        else:
            ref, weights = out.layers.mean(dim=1), torch.full((L1,), 1.0 / L1)
        got, mask = model.run_combined(ids, weights)
    assert torch.equal(mask, out.mask)
    # the fused weighted sum of 3 fp32 layers vs a separate one: a few ulp of |x| <~ 5
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
    assert not got[~mask].any()


def test_the_packed_mix_is_the_same_with_autograd_on_and_off(tiny_dir):
    """With autograd off the mix is made in the packed input's place (``combine_packed``); with
    it on, in a new tensor that gradients flow through: the same vectors."""

    model = load_bilm(tiny_dir)
    ids = torch.from_numpy(batch_to_ids(SENTENCES))
    weights = torch.tensor([0.2, 0.3, 0.5])
    with torch.inference_mode():
        off, _ = model.run_combined(ids, weights)
    on, mask = model.run_combined(ids, weights)
    on.sum().backward()
    assert model.lstm.w_input.grad is not None and model.lstm.w_input.grad.abs().sum() > 0
    torch.testing.assert_close(on.detach(), off, atol=1e-6, rtol=0)
    assert not off[~mask].any(), "padding must be zero"


@pytest.mark.parametrize("layout", [None, "packed", "rows"])
def test_taken_tokens_are_the_rows_of_the_whole_grid(tiny_dir, layout):
    """``run_combined(..., take)`` gathers the named tokens straight from the packed rows (how
    ``elmo embed`` takes a batch's tokens): bit for bit the rows of the (B, T, 2P) grid it skips,
    in ``take``'s order, a padding position among them zero; the reference, the fast path and
    the static rows (run eagerly, as a CPU runs them) alike."""
    from inference.fast_path import FastInference
    from inference.row_shape import RowShape

    model = load_bilm(tiny_dir)
    if layout is not None:
        model.use_fast_path(FastInference(model, layout=layout, capture=False, rows=RowShape(4, 3)))
    ids = torch.from_numpy(batch_to_ids(SENTENCES + [["One"]]))
    weights = torch.tensor([0.2, 0.3, 0.5])
    with torch.inference_mode():
        grid, mask = model.run_combined(ids, weights)  # (B, T, 2P)
        B, T = mask.shape
        take = torch.nonzero(mask.reshape(-1)).squeeze(1).flip(0)  # every token, last first
        take = torch.cat([take, torch.tensor([B * T - 1])])  # and the last row's padding
        got, got_mask = model.run_combined(ids, weights, take)  # (n, 2P)
    assert not mask.reshape(-1)[-1], "the last position is padding"
    assert torch.equal(got_mask, mask)
    assert torch.equal(got, grid.reshape(B * T, -1)[take])
    assert not got[-1].any()
