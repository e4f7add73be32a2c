"""The LSTM cell of the biLM, and where each faster variant of it lives.

``lstm_step`` is the reference: the original's cell (bilm-tf's ``LSTMCell`` with
``num_proj``): gates in TF's order i, j, f, o with TF's +1 forget bias added to f,
``c = sigmoid(f) c_prev + sigmoid(i) tanh(j)``, c clipped to ``cell_clip``,
``h = (sigmoid(o) tanh(c)) W_P`` clipped to ``proj_clip``. Changing the cell means changing it
here and in each variant below; each is tested against ``lstm_step``:

- ``inference.fast_lstm.lstm_step_inplace``: inference on a CPU (torch backend). Same maths,
  computed in place in the gate buffer, the projection injected (pre-packed oneDNN weights on x86
  CPUs). Tested in ``tests/core/test_lstm_cell.py``.
- ``inference.scripted_steps._run_chunk``: a small fp32 model's steps on a CPU, a chunk of them as
  one TorchScript loop (no GIL between the direction threads). Tested against the model and the
  Python loop in ``tests/inference/test_scripted_steps.py``.
- ``elmo_core.fused_cell``: the element-wise part of a step (``cell``, ``store``; training's
  ``train_forward``, ``train_store``, ``train_backward_h``, ``train_backward_cell``) as one compiled
  kernel each, for CUDA (``inference.fused_lstm``, ``inference.row_lstm``,
  ``elmo_core.fused_sequence``). Tested in ``tests/core/test_fused_cell.py``.
- ``elmo_core.lstm_sequence.LstmSequence``: training. A layer's whole recurrence as one autograd
  function with a hand-written backward. Tested against autograd over ``lstm_step`` in
  ``tests/core/test_lstm_sequence.py``.
- ``export.onnx_lstm.lstm_step_graph``: the ONNX Scan body's step (ONNX Runtime, TensorRT).
  Tested against ``lstm_step`` in ``tests/export/test_onnx_lstm.py``.

``tests/reference_impl.py`` computes the whole biLM independently in float64 (ground truth for
the model, deliberately not sharing this code).
"""
from __future__ import annotations

import torch


def lstm_step(gates: torch.Tensor, c_prev: torch.Tensor, w_proj: torch.Tensor,
              cell_clip: float | None, proj_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference LSTM step, from its pre-activations (TF gate order i, j, f, o; the +1 forget
    offset already added to f).

    Shape: gates (D, N, 4C), c_prev (D, N, C), w_proj (D, C, P) -> h (D, N, P), c (D, N, C).
    """
    i, j, f, o = gates.chunk(4, dim=-1)  # (D, N, C) each
    c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(j)  # (D, N, C)
    if cell_clip is not None:
        c = c.clamp(-cell_clip, cell_clip)
    h = torch.bmm(torch.sigmoid(o) * torch.tanh(c), w_proj)  # (D, N, P)
    if proj_clip is not None:
        h = h.clamp(-proj_clip, proj_clip)
    return h, c


def low_bmm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a @ w`` with ``a`` rounded to ``w``'s type, the result in ``a``'s type (no casts when the
    types agree): every reduced-precision product of the LSTM, training and inference.

    Shape: a (D, N, K), w (D, K, M) -> (D, N, M).
    """
    return torch.bmm(a.to(w.dtype), w).to(a.dtype)
