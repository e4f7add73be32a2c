"""The training recurrence with fused, compiled steps (``elmo_core.fused_sequence``, inductor's CPU
backend here) against autograd over ``lstm_step`` in float64, as accurate as ``LstmSequence``."""
from __future__ import annotations

import pytest
import torch

from elmo_core.fused_sequence import fused_lstm_sequence, last_positions, previous_positions
from elmo_core.lstm import Packing
from elmo_core.lstm_sequence import lstm_sequence

from tests.core.test_lstm_sequence import _autograd_layer


def _error(got, want) -> float:
    return float((got.double() - want).abs().max())


CASES = [  # (lengths, shared first step, clips, products' type), eager kernels
    ([6, 6, 6], False, (None, None), None),
    ([5, 3, 3, 1], False, (1.0, 0.8), None),
    ([6, 4, 2], True, (1.0, 0.8), None),
    ([5, 3, 3, 1], False, (1.0, 0.8), torch.bfloat16),
    ([6, 4, 2], True, (None, None), torch.bfloat16),
]  # compiled, as on CUDA: each kernel in tests/core/test_fused_cell.py, the whole recurrence's values
# and gradients through `elmo train --compile` = eager training in tests/training/test_compile.py


@pytest.mark.parametrize("lengths,shared,clips,low", CASES)
def test_values_and_gradients_as_accurate_as_the_unfused_recurrence(lengths, shared, clips, low):
    """fp32 (or bf16 products) against float64 autograd: the fused steps' error, values and every
    gradient, is at most twice the unfused ``LstmSequence``'s in the same precision plus a few
    fp32 roundings of the result's scale (sigmoid and tanh vectorized differently, sums reordered)."""
    from elmo_core.fused_cell import FusedCell

    kernels = FusedCell.eager()
    g = torch.Generator().manual_seed(len(lengths))
    pack = Packing(torch.tensor(lengths), max(lengths), shared_first=shared)
    D, P, C, B, N = 2, 5, 7, len(lengths), sum(n for _, n in pack.steps)
    scales = (2.0, 1.0, 2.0, 1.0, 1.0)
    exact = [(s * torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()
             for s, shape in zip(scales, [(D, N, 4 * C), (D, B, P), (D, B, C), (D, P, 4 * C), (D, C, P)])]
    single = [x.detach().float().requires_grad_() for x in exact]
    fused_in = [x.detach().float().requires_grad_() for x in exact]
    want = _autograd_layer(*exact, pack.steps, shared, *clips)
    plain = lstm_sequence(*single, pack.steps, shared, *clips, low)
    got = fused_lstm_sequence(*fused_in, pack.steps, shared, *clips, low, kernels)
    weights = [torch.randn(x.shape, generator=g, dtype=torch.float64) for x in want]
    grads = [torch.autograd.grad(sum((x * w.to(x.dtype)).sum() for x, w in zip(out, weights)), inputs)
             for out, inputs in ((want, exact), (plain, single), (got, fused_in))]
    for name, ref, a, b in zip(["out", "h", "c", "d_gx", "d_h0", "d_c0", "d_w_state", "d_w_proj"],
                               [*want, *grads[0]], [*plain, *grads[1]], [*got, *grads[2]]):
        scale = float(ref.detach().abs().max())
        bound = 2 * _error(a, ref) + 8 * 2.0 ** -24 * scale
        assert _error(b, ref) <= bound, (name, _error(b, ref), _error(a, ref))
    assert (got[0].detach().abs().max() > 0) and (clips[0] is None or float(got[0].detach().abs().max()) == pytest.approx(clips[1]))


def test_positions_of_the_recurrent_inputs_and_the_final_states():
    steps = [(0, 3), (3, 3), (6, 2), (8, 1)]  # rows of lengths 4, 3, 2
    assert previous_positions(steps, 3, False) == [9, 10, 11, 0, 1, 2, 3, 4, 6]
    assert last_positions(steps, 3, False) == [8, 7, 5]
    shared = [(0, 1), (1, 3), (4, 2)]  # step 0 ran once for rows of lengths 3, 3, 2
    assert previous_positions(shared, 3, True) == [6, 0, 0, 0, 1, 2]
    assert last_positions(shared, 3, True) == [4, 5, 3]


def test_after_its_first_batch_the_recurrence_compiles_nothing_whatever_its_steps():
    """A count, not a time: the kernels compile their variants in the first batch; a later batch with
    a step of all rows, of some, or of one or two (run on the eager kernels), other counts of rows,
    and a shared first step compiles none (else a training run pays seconds of compiling at
    whichever step first meets one, as the H200 run did). Widths unlike any row count: sizes equal
    by chance still compile again (duck sizing, left on: docs/gpu.md)."""
    from torch._dynamo.utils import counters

    from elmo_core.fused_cell import FusedCell

    kernels = FusedCell.compile()  # caches of its own
    g = torch.Generator().manual_seed(0)

    def run(lengths: list[int], shared: bool = False) -> None:
        pack = Packing(torch.tensor(lengths), max(lengths), shared_first=shared)
        D, P, C, B, N = 2, 37, 23, len(lengths), sum(n for _, n in pack.steps)
        inputs = [torch.randn(*shape, generator=g).requires_grad_()
                  for shape in [(D, N, 4 * C), (D, B, P), (D, B, C), (D, P, 4 * C), (D, C, P)]]
        out = fused_lstm_sequence(*inputs, pack.steps, shared, 1.0, 0.8, torch.bfloat16, kernels)
        sum(x.float().sum() for x in out).backward()

    run([5, 5, 5, 3, 3, 3])  # steps of 6 rows (all) and of 3
    compiled = counters["stats"]["unique_graphs"]
    run([7, 6, 6, 6, 6, 2, 2, 2])  # 8 rows, 5, 1 (the last step)
    run([4, 4, 4, 4, 4, 1, 1], shared=True)  # a shared first step of one row, then 7 and 5
    run([9, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8])  # 11 rows, then 1
    run([5, 5, 4, 4, 4])  # 5 rows, then 3
    assert counters["stats"]["unique_graphs"] == compiled
