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
# recurrences into outputs of up to ~2.3 (a layer's output plus its skip input): a few ulps (measured
# <= 6e-7 absolute; an ulp at 2 is 2.4e-7)
TOLERANCE = dict(atol=1e-6, rtol=1e-6)
CELL_CLIP, PROJ_CLIP = 0.5, 0.75  # low enough for this random model's cells and outputs to reach them


def _outputs(model, fast: FastInference | None, ids: torch.Tensor, shortcut: bool) -> tuple[torch.Tensor, ...]:
    """The stateless run's mix (step 0 shared by every row), or a run from a start state: its layers
    and each row's final (h, c)."""
    model.use_fast_path(fast)
    try:
        with torch.inference_mode():
            if shortcut:
                return (model.run_combined(ids, torch.tensor([0.2, 0.3, 0.5]))[0],)
            gen = torch.Generator().manual_seed(1)
            state = model.lstm.zero_state(ids.shape[0])
            state.h.uniform_(-0.5, 0.5, generator=gen)
            state.c.uniform_(-0.5, 0.5, generator=gen)
            got = model.run(ids, state=state)
            return got.layers, got.state.h, got.state.c
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
    options = tiny_options(lstm__dim=cell, lstm__cell_clip=CELL_CLIP, lstm__proj_clip=PROJ_CLIP)
    model = load_bilm(make_model_dir(tmp_path / "m", options, seed=5, lstm_scale=2.0))
    ids = torch.from_numpy(batch_to_ids(SENTENCES))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast = FastInference(model, chunk_rows=chunk_rows)
        assert isinstance(fast.lstm, FastLstm) and fast.lstm.scripted()
        got = _outputs(model, fast, ids, shortcut)
        want = _outputs(model, None, ids, shortcut)
        monkeypatch.setattr(FastLstm, "scripted", lambda self: False)
        python_loop = _outputs(model, FastInference(model, chunk_rows=chunk_rows), ids, shortcut)
    finally:
        torch.set_num_threads(before)
    if not shortcut:  # both clips reached: the first layer's output and a final cell state at the clip
        assert (want[0][:, 1].abs() == PROJ_CLIP).any() and (want[2].abs() == CELL_CLIP).any()
    for a, b, c in zip(got, want, python_loop):
        torch.testing.assert_close(a, b, **TOLERANCE)
        torch.testing.assert_close(a, c, **TOLERANCE)

def test_only_small_fp32_models_on_a_cpu_take_the_scripted_steps(tiny_dir):
    """bf16 keeps its rounding steps, a model on packed oneDNN weights its packed products."""
    model = load_bilm(tiny_dir)
    assert FastLstm(model.lstm).scripted() is (scripted_chunk() is not None)
    assert not FastLstm(model.lstm, torch.bfloat16).scripted()
    assert not FastLstm(model.lstm, packed_min_weights=0).scripted() or not torch.backends.mkldnn.is_available()
