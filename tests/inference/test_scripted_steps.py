"""The small models' TorchScript steps (``inference.scripted_steps``) against the model's own
recurrence and the Python loop they replace, on every path through them."""
from __future__ import annotations

import pytest
import torch

from elmo_core import batch_to_ids
from formats import load_bilm
from inference.fast_lstm import FastLstm
from inference.fast_path import FastInference
from inference.scripted_steps import WHOLE_SIGMOID_MAX_CELL, scripted_chunk

from tests.helpers import SENTENCES, make_model_dir, tiny_options

# fp32 both ways, the same products in the same order; the cells' tanh differ (ATen's here, numpy's in
# the Python loop and the model's, each within 6e-8 of the exact value), carried through clipped
# recurrences into outputs of up to ~9 (a layer's output plus its skip input; an ulp at 8 is 9.5e-7):
# a few ulps (measured <= 9.6e-7 absolute)
TOLERANCE = dict(atol=1e-6, rtol=1e-6)


def _layers(model, fast: FastInference | None, ids: torch.Tensor, shortcut: bool) -> torch.Tensor:
    model.use_fast_path(fast)
    try:
        with torch.inference_mode():
            if shortcut:  # the stateless run: step 0 shared by every row
                return model.run_combined(ids, torch.tensor([0.2, 0.3, 0.5]))[0]
            state = model.lstm.zero_state(ids.shape[0])
            state.h.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(1))
            return model.run(ids, state=state).layers
    finally:
        model.use_fast_path(None)


@pytest.mark.skipif(scripted_chunk() is None, reason="this torch cannot script the steps (no TorchScript)")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("chunk_rows", [None, 3])
@pytest.mark.parametrize("cell", [6, WHOLE_SIGMOID_MAX_CELL + 4])
@pytest.mark.parametrize("shortcut", [True, False])
def test_scripted_steps_compute_what_the_model_and_the_python_loop_do(tmp_path, threads, chunk_rows, cell,
                                                                      shortcut, monkeypatch):
    """Directions on threads of their own (2) or together (1); one chunk of steps or many (3 rows
    a chunk: every chunk boundary inside a sentence); a narrow cell (one sigmoid over the gates)
    and a wide one (three); the shared first step or a start state carried in."""
    options = tiny_options(lstm__dim=cell)
    model = load_bilm(make_model_dir(tmp_path / "m", options, seed=5, lstm_scale=2.0))
    ids = torch.from_numpy(batch_to_ids(SENTENCES))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast = FastInference(model, chunk_rows=chunk_rows)
        assert isinstance(fast.lstm, FastLstm) and fast.lstm.scripted()
        got = _layers(model, fast, ids, shortcut)
        want = _layers(model, None, ids, shortcut)
        monkeypatch.setattr(FastLstm, "scripted", lambda self: False)
        python_loop = _layers(model, FastInference(model, chunk_rows=chunk_rows), ids, shortcut)
    finally:
        torch.set_num_threads(before)
    assert want.abs().amax() > 1.0, "the clips were never reached"
    torch.testing.assert_close(got, want, **TOLERANCE)
    torch.testing.assert_close(got, python_loop, **TOLERANCE)


def test_only_small_fp32_models_on_a_cpu_take_the_scripted_steps(tiny_dir):
    """bf16 keeps its rounding steps, a model on packed oneDNN weights its packed products."""
    model = load_bilm(tiny_dir)
    assert FastLstm(model.lstm).scripted() is (scripted_chunk() is not None)
    assert not FastLstm(model.lstm, torch.bfloat16).scripted()
    assert not FastLstm(model.lstm, packed_min_weights=0).scripted() or not torch.backends.mkldnn.is_available()
