"""One LSTM layer's whole recurrence as a single autograd function (training path).

Autograd over ``lstm_step`` records ~15 small ops per step, differentiates each of them, and
computes each step's weight gradients as its own small matrix product. Here the forward loop
writes, per step, only the factors the backward multiplies by (gate derivatives, clip masks) into
packed buffers; the backward loop does the sequential part (two matrix products and a few
element-wise ops per step); and the weight gradients are one batched product over all steps.
Same maths as ``lstm_step`` (TF gate order i, j, f, o; clamp gradients pass where
``-clip <= x <= clip``, as torch's), so gradients agree with autograd to rounding.

``matmul_dtype`` bf16 / fp16 (training under autocast; None: the tensors' own type): every
matrix product, forward and backward, takes its inputs in that type and gives fp32; the cell,
gates, clips and every saved factor stay fp32 (``inference.precision``'s rule, as inference).
"""
from __future__ import annotations

import torch

from .lstm_cell import low_bmm


def _bmm_in(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``a @ b`` with both inputs in ``dtype`` (None: as they are), out in ``a``'s type (a weight
    gradient from two activations)."""
    return torch.bmm(a, b) if dtype is None else torch.bmm(a.to(dtype), b.to(dtype)).to(a.dtype)


class LstmSequence(torch.autograd.Function):
    """Shape: gx (D, N, 4C) packed input pre-activations (bias and forget offset in), h0 (D, B, P),
    c0 (D, B, C), w_state (D, P, 4C), w_proj (D, C, P) -> out (D, N, P), h (D, B, P), c (D, B, C).

    ``steps``: (offset, active rows) per step, active rows non-increasing (``Packing.steps``);
    rows past the active ones keep their state. ``shared_first``: step 0 runs one row and its
    state then holds for every row. ``matmul_dtype``: the products' input type (module doc).
    """

    @staticmethod
    def forward(ctx, gx, h0, c0, w_state, w_proj, steps, shared_first, cell_clip, proj_clip,  # noqa: PLR0913
                matmul_dtype=None):
        if matmul_dtype is not None:
            w_state, w_proj = w_state.to(matmul_dtype), w_proj.to(matmul_dtype)  # (D, P, 4C), (D, C, P)
        D, N, G = gx.shape
        C, P, B = G // 4, w_proj.shape[-1], h0.shape[1]
        # What the backward multiplies by, written per step straight into packed (D, N, .) buffers.
        # Matrix-product operands stay contiguous: products on strided slices ran 2-3x slower.
        dc_factor, o_factor, f_gate, m_all = (gx.new_empty(D, N, C) for _ in range(4))
        gate_factor = gx.new_empty(D, N, 3 * C)  # d gates i, j, f per unit of cell gradient
        h_prev, out = gx.new_empty(D, N, P), gx.new_empty(D, N, P)
        c_kept = torch.empty(D, N, C, dtype=torch.bool, device=gx.device) if cell_clip is not None else None  # clamp passes
        h_kept = torch.empty(D, N, P, dtype=torch.bool, device=gx.device) if proj_clip is not None else None
        h, c = h0, c0
        for start, n in steps:
            sl = slice(start, start + n)
            a = low_bmm(h[:, :n], w_state).add_(gx[:, sl])  # (D, n, 4C)
            a[..., :C].sigmoid_()
            a[..., C : 2 * C].tanh_()
            a[..., 2 * C :].sigmoid_()
            i, j, f, o = a.chunk(4, dim=-1)  # (D, n, C) each: sigmoid(i), tanh(j), sigmoid(f), sigmoid(o)
            ij, fc = i * j, f * c[:, :n]  # (D, n, C)
            c_raw = fc + ij  # (D, n, C)
            c_new = c_raw.clamp(-cell_clip, cell_clip) if cell_clip is not None else c_raw
            tc = torch.tanh(c_new)  # (D, n, C)
            m = o * tc  # (D, n, C): the projection's input
            h_raw = low_bmm(m, w_proj)  # (D, n, P)
            h_new = h_raw.clamp(-proj_clip, proj_clip) if proj_clip is not None else h_raw
            torch.addcmul(o, m, tc, value=-1, out=dc_factor[:, sl])  # o (1 - tanh(c)^2)
            torch.addcmul(m, m, o, value=-1, out=o_factor[:, sl])  # tanh(c) o (1 - o)
            gf = gate_factor[:, sl]  # (D, n, 3C)
            torch.addcmul(ij, ij, i, value=-1, out=gf[..., :C])  # j i (1 - i)
            torch.addcmul(i, ij, j, value=-1, out=gf[..., C : 2 * C])  # i (1 - j^2)
            torch.addcmul(fc, fc, f, value=-1, out=gf[..., 2 * C :])  # c_prev f (1 - f)
            if c_kept is not None:
                torch.eq(c_new, c_raw, out=c_kept[:, sl])
            if h_kept is not None:
                torch.eq(h_new, h_raw, out=h_kept[:, sl])
            f_gate[:, sl], m_all[:, sl], h_prev[:, sl], out[:, sl] = f, m, h[:, :n], h_new
            h, c = carry_state(h, c, h_new, c_new, shared_first and start == 0)
        ctx.steps, ctx.shared_first, ctx.B, ctx.matmul_dtype = steps, shared_first, B, matmul_dtype
        ctx.save_for_backward(w_state, w_proj, h_prev, m_all, dc_factor, gate_factor, o_factor, f_gate, c_kept, h_kept)
        return out, h.contiguous(), c.contiguous()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out, g_h, g_c):
        w_state, w_proj, h_prev, m, dc_factor, gate_factor, o_factor, f_gate, c_kept, h_kept = ctx.saved_tensors
        D, N, C = m.shape
        P, B = h_prev.shape[-1], ctx.B
        g_out = g_out if g_out is not None else h_prev.new_zeros(D, N, P)
        carry_h = g_h.clone() if g_h is not None else h_prev.new_zeros(D, B, P)  # (D, B, P)
        carry_c = g_c.clone() if g_c is not None else h_prev.new_zeros(D, B, C)  # (D, B, C)
        ws_t = w_state.transpose(1, 2).contiguous()  # (D, 4C, P): contiguous, 2-3x faster products
        wp_t = w_proj.transpose(1, 2).contiguous()  # (D, P, C)
        d_gates, d_hraw = [], []  # per step, last step first: (D, n, 4C), (D, n, P)
        for start, n in reversed(ctx.steps):
            sl = slice(start, start + n)
            shared = ctx.shared_first and start == 0 and n < B  # its state went to every row
            ch = carry_h.sum(1, keepdim=True) if shared else carry_h[:, :n]  # (D, n, P)
            cc = carry_c.sum(1, keepdim=True) if shared else carry_c[:, :n]  # (D, n, C)
            dh = g_out[:, sl] + ch  # (D, n, P)
            if h_kept is not None:
                dh.mul_(h_kept[:, sl])
            dm = low_bmm(dh, wp_t)  # (D, n, C)
            dc = torch.addcmul(cc, dm, dc_factor[:, sl])  # (D, n, C): at the clipped cell
            if c_kept is not None:
                dc.mul_(c_kept[:, sl])  # now at the cell before the clip
            g = dh.new_empty(D, n, 4 * C)  # (D, n, 4C)
            torch.mul(dc[:, :, None, :], gate_factor[:, sl].view(D, n, 3, C), out=g[..., : 3 * C].view(D, n, 3, C))
            torch.mul(dm, o_factor[:, sl], out=g[..., 3 * C :])
            d_gates.append(g)
            d_hraw.append(dh)
            dh_prev, dc_prev = low_bmm(g, ws_t), dc.mul_(f_gate[:, sl])  # (D, n, P), (D, n, C)
            if shared:
                carry_h, carry_c = carry_h.new_zeros(D, B, P), carry_c.new_zeros(D, B, C)
            carry_h[:, :n], carry_c[:, :n] = dh_prev, dc_prev
        d_gates_all = torch.cat(d_gates[::-1], dim=1)  # (D, N, 4C)
        low = ctx.matmul_dtype
        d_ws = _bmm_in(h_prev.transpose(1, 2), d_gates_all, low)  # (D, P, 4C): all steps in one product
        d_wp = _bmm_in(m.transpose(1, 2), torch.cat(d_hraw[::-1], dim=1), low)  # (D, C, P)
        return d_gates_all, carry_h, carry_c, d_ws, d_wp, None, None, None, None, None


def carry_state(h: torch.Tensor, c: torch.Tensor, h_new: torch.Tensor, c_new: torch.Tensor,
                shared_step: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The state after a step that ran the first n rows: those rows take the new state, finished
    rows keep theirs; a shared first step's state holds for every row. No in-place update, so
    autograd can differentiate it too.

    Shape: h (D, B, P), c (D, B, C), h_new (D, n, P), c_new (D, n, C) -> h (D, B, P), c (D, B, C).
    """
    if h_new.shape[1] == h.shape[1] or shared_step:
        return h_new.expand_as(h), c_new.expand_as(c)
    n = h_new.shape[1]
    return torch.cat([h_new, h[:, n:]], dim=1), torch.cat([c_new, c[:, n:]], dim=1)


def lstm_sequence(gx: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, w_state: torch.Tensor,
                  w_proj: torch.Tensor, steps: list[tuple[int, int]], shared_first: bool,
                  cell_clip: float | None, proj_clip: float | None,
                  matmul_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``LstmSequence.apply``; see its Shape line."""
    return LstmSequence.apply(gx, h0, c0, w_state, w_proj, steps, shared_first, cell_clip, proj_clip, matmul_dtype)
