"""One LSTM layer's recurrence for training with fused steps: ``LstmSequence`` in four kernels a step.

``lstm_sequence.LstmSequence`` (the training path) makes about twenty element-wise kernels per
step forward and ten backward around its products; on a GPU their launches bound a step.
``FusedLstmSequence`` is the same autograd function (same inputs, outputs, gradients) with each
step's element-wise work in one compiled kernel (``elmo_core.fused_cell``):

    forward:  r = h W_h;  m = train_forward(gx + r, c) (writes the backward's factors);
              h_raw = m W_P;  train_store(h_raw) (clip, output, next h, the clip's mask)
    backward: dh = train_backward_h(g_out + carry_h);  dm = dh W_P^T;
              g = train_backward_cell(dm, carry_c) (gates' gradient, previous cell's);  dh_prev = g W_h^T

The weight gradients are one batched product each over all steps, as in ``LstmSequence``. The
next step's ``h`` is kept in the products' type, so bf16 / fp16 steps cast nothing. Used for
``elmo train --compile`` (``BiLstmStack.compile_cell``); tested against
autograd over ``lstm_step`` in tests/core/test_fused_sequence.py (inductor's CPU backend).
"""
from __future__ import annotations

import torch

from .fused_cell import FusedCell, clip_tensor
from .host_to_device import index_to_device
from .lstm_sequence import _bmm_in


def last_positions(steps: list[tuple[int, int]], rows: int, shared_first: bool) -> list[int]:
    """Each row's last packed position (-1: it never ran); a shared first step counts for every row."""
    last = [-1] * rows
    for start, n in steps:
        last[:n] = range(start, start + n)
    if shared_first and steps:
        last = [0 if i < 0 else i for i in last]
    return last


def previous_positions(steps: list[tuple[int, int]], rows: int, shared_first: bool) -> list[int]:
    """Where each packed position's recurrent input comes from: the previous step's output of the
    same row (an index < N), or the initial state of the row (N + row).

    Shape: -> (N,) indices into the (N + B) axis of outputs then initial states.
    """
    n_pos = sum(n for _, n in steps)
    prev = []
    for t, (start, n) in enumerate(steps):
        if t == 0:
            prev.extend(range(n_pos, n_pos + n))
        elif shared_first and t == 1:
            prev.extend([steps[0][0]] * n)
        else:
            prev.extend(range(steps[t - 1][0], steps[t - 1][0] + n))
    return prev


_EAGER = FusedCell.eager()


def _kernels(kernels: FusedCell, rows: int) -> FusedCell:
    """The kernels a step of ``rows`` rows runs: a step of one or two rows the eager ones (the same
    maths), as a compiler specializes a size of 1, and takes a size of 2 for the directions' (duck
    sizing: turning it off measured 1.8x the host's time a training step), so either would compile
    every kernel again at whichever training step first has one, seconds into a run; the others
    ``kernels``."""
    return _EAGER if rows <= 2 else kernels


def _state(x: torch.Tensor | None, like: torch.Tensor, shape: tuple[int, int, int],
           dtype: torch.dtype | None = None) -> torch.Tensor:
    """A copy of a (D, B, W) state ``x`` (None: zeros) in ``dtype`` (default ``like``'s), on ``like``'s
    device, in a buffer of B + 1 rows, so that no step's rows ``[:, :n]`` are contiguous: the kernels
    meet one memory layout whatever the step's rows, and compile one variant (a step of all B rows
    would otherwise compile another, at whichever training step first has one).

    Shape: -> (D, B, W), a view of (D, B + 1, W)."""
    D, B, W = shape
    buffer = (like.new_zeros if x is None else like.new_empty)(D, B + 1, W, dtype=dtype or like.dtype)
    if x is not None:
        buffer[:, :B] = x
    return buffer[:, :B]


class FusedLstmSequence(torch.autograd.Function):
    """``LstmSequence`` with fused steps (module doc); the same Shape line and arguments, and
    ``kernels`` (default ``FusedCell.compiled()``)."""

    @staticmethod
    def forward(ctx, gx, h0, c0, w_state, w_proj, steps, shared_first, cell_clip, proj_clip,  # noqa: PLR0913
                matmul_dtype=None, kernels=None):
        k, low = kernels or FusedCell.compiled(), matmul_dtype or gx.dtype
        ws, wp = w_state.to(low), w_proj.to(low)  # (D, P, 4C), (D, C, P)
        D, N, G = gx.shape
        C, P, B = G // 4, w_proj.shape[-1], h0.shape[1]
        cc, pc = clip_tensor(cell_clip, gx.device), clip_tensor(proj_clip, gx.device)
        saved = tuple(gx.new_empty(D, N, width) for width in (C, C, C, 3 * C, C)) + (
            torch.empty(D, N, C, dtype=torch.bool, device=gx.device),)  # m, dc, o, gates, f, cell clip mask
        out, h_kept = gx.new_empty(D, N, P), torch.empty(D, N, P, dtype=torch.bool, device=gx.device)
        h, c = _state(h0, h0, h0.shape, low), _state(c0, c0, c0.shape)  # (D, B, P) the products' input, (D, B, C)
        for start, n in steps:
            sl, kn = slice(start, start + n), _kernels(k, n)
            m = kn.train_forward(gx[:, sl], torch.bmm(h[:, :n], ws), c[:, :n], cc, tuple(s[:, sl] for s in saved), low)
            kn.train_store(torch.bmm(saved[0][:, sl] if m is None else m, wp), out[:, sl], h[:, :n], h_kept[:, sl], pc)
            if shared_first and start == 0 and n < B:  # step 0 ran once: its state holds for every row
                h[:], c[:] = h[:, :1].clone(), c[:, :1].clone()
        prev = index_to_device(previous_positions(steps, B, shared_first), gx.device)
        h_prev = torch.cat([out, h0.float()], dim=1)[:, prev]  # (D, N, P): each step's recurrent input
        last = index_to_device(last_positions(steps, B, shared_first), gx.device)
        h_fin = torch.where((last >= 0)[None, :, None], out[:, last.clamp(min=0)], h0)  # (D, B, P)
        ctx.steps, ctx.shared_first, ctx.B, ctx.low, ctx.kernels = steps, shared_first, B, low, k
        ctx.save_for_backward(ws, wp, h_prev, h_kept, *saved)
        return out, h_fin.contiguous(), c.contiguous()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out, g_h, g_c):
        ws, wp, h_prev, h_kept, *saved = ctx.saved_tensors
        k, low, B = ctx.kernels, ctx.low, ctx.B
        D, N, P = h_prev.shape
        C = saved[0].shape[-1]
        g_out = g_out if g_out is not None else h_prev.new_zeros(D, N, P)
        carry_h = _state(g_h, h_prev, (D, B, P))  # (D, B, P)
        carry_c = _state(g_c, h_prev, (D, B, C))  # (D, B, C)
        ws_t, wp_t = ws.transpose(1, 2).contiguous(), wp.transpose(1, 2).contiguous()  # (D, 4C, P), (D, P, C)
        d_gates, d_hraw = h_prev.new_empty(D, N, 4 * C), h_prev.new_empty(D, N, P)
        for start, n in reversed(ctx.steps):
            sl = slice(start, start + n)
            shared = ctx.shared_first and start == 0 and n < B  # its state went to every row
            ch = carry_h.sum(1, keepdim=True) if shared else carry_h[:, :n]  # (D, n, P)
            cc = carry_c.sum(1, keepdim=True) if shared else carry_c[:, :n]  # (D, n, C), becomes dc_prev
            kn = _kernels(k, n)
            dh = kn.train_backward_h(g_out[:, sl], ch, h_kept[:, sl], d_hraw[:, sl], low)
            dm = torch.bmm(d_hraw[:, sl] if dh is None else dh, wp_t)  # (D, n, C)
            g = kn.train_backward_cell(dm, cc, tuple(s[:, sl] for s in saved), d_gates[:, sl], low)
            dh_prev = torch.bmm(d_gates[:, sl] if g is None else g, ws_t)  # (D, n, P)
            if shared:
                carry_h, carry_c = _state(None, carry_h, (D, B, P)), _state(None, carry_c, (D, B, C))
                carry_c[:, :n] = cc
            carry_h[:, :n] = dh_prev
        d_ws = _bmm_in(h_prev.transpose(1, 2), d_gates, None if low == torch.float32 else low)  # (D, P, 4C)
        d_wp = _bmm_in(saved[0].transpose(1, 2), d_hraw, None if low == torch.float32 else low)  # (D, C, P)
        return d_gates, carry_h, carry_c, d_ws, d_wp, None, None, None, None, None, None


def fused_lstm_sequence(gx: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, w_state: torch.Tensor,
                        w_proj: torch.Tensor, steps: list[tuple[int, int]], shared_first: bool,
                        cell_clip: float | None, proj_clip: float | None, matmul_dtype: torch.dtype | None = None,
                        kernels: FusedCell | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``FusedLstmSequence.apply``; the arguments of ``lstm_sequence.lstm_sequence``, and ``kernels``."""
    return FusedLstmSequence.apply(gx, h0, c0, w_state, w_proj, steps, shared_first, cell_clip, proj_clip,
                                   matmul_dtype, kernels)
