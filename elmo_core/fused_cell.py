"""The element-wise part of an LSTM step, written for a compiler to fuse into one kernel each.

A step of the biLM's LSTM (``elmo_core.lstm_cell.lstm_step``, the reference) is two matrix
products, the recurrent one (``h W_h``) and the projection (``m W_P``), around element-wise work:
the gate nonlinearities, the cell update and its clip, the projection's clip. Run eagerly, that
work is a handful of kernels, each a pass over the (rows x 4C) gate tensor, and on a GPU their
launches, not the products, bound a step. Each function below is that work written once in plain
torch; ``FusedCell.compiled()`` gives them through ``torch.compile`` (inductor: one Triton kernel
each on CUDA, one C++ loop each on the CPU), ``FusedCell.eager()`` uncompiled. The products stay
with cuBLAS / oneDNN.

Conventions: ``D`` directions, ``n`` rows of this step, ``C`` cell units, ``P`` projection units;
the gates in TF's order i, j, f, o with the +1 forget offset already in ``gx``; a clip is a 0-d
tensor on the device (``clip_tensor``: inf for none), so one compiled kernel serves every value.
Buffers passed in are written in place (a compiled kernel stores straight into them).

Tested against ``lstm_step`` eagerly and compiled (inductor's CPU backend) in
tests/core/test_fused_cell.py; the recurrences built on them in tests/core/test_bilm.py
(inference) and tests/core/test_fused_sequence.py (training).
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Callable

import torch


def clip_tensor(clip: float | None, device: torch.device | str) -> torch.Tensor:
    """A clip as the kernels take it: a 0-d fp32 tensor, inf for no clipping."""
    return torch.full((), math.inf if clip is None else float(clip), dtype=torch.float32, device=device)  # no copy


def tanh(x: torch.Tensor) -> torch.Tensor:
    """``tanh`` as ``2 sigmoid(2x) - 1`` (within 2e-7 of ``torch.tanh``): inductor's C++ code runs
    this 3x faster than its own tanh (torch 2.13, AVX-512: 0.68 vs 2.1 ms over 64 x 16,384 floats),
    Triton alike."""
    return 2 * torch.sigmoid(2 * x) - 1


def cell(gx: torch.Tensor, r: torch.Tensor, c: torch.Tensor, keep: torch.Tensor | None,
         cell_clip: torch.Tensor, m_dtype: torch.dtype) -> torch.Tensor:
    """Inference: the gates (``gx + r``) to the projection's input ``m``; ``c`` becomes the new
    cell state. ``keep`` (bool per row, or None): the state is zeroed first where it is False (a
    sentence starts at this step; ``r`` is then already zero). Gates and cell in fp32 whatever
    the inputs' type.

    Shape: gx (D, n, 4C), r (D, n, 4C), c (D, n, C) fp32 in place, keep (1, n, 1) -> m (D, n, C) in m_dtype.
    """
    C = c.shape[-1]
    gates = gx.float() + r.float()  # (D, n, 4C)
    i, j, f, o = gates.split(C, dim=-1)  # (D, n, C) each
    c_prev = c if keep is None else torch.where(keep, c, 0.0)
    c_new = (torch.sigmoid(f) * c_prev + torch.sigmoid(i) * tanh(j)).clamp(-cell_clip, cell_clip)
    c.copy_(c_new)
    return (torch.sigmoid(o) * tanh(c_new)).to(m_dtype)


def store(h_raw: torch.Tensor, out: torch.Tensor, h_next: torch.Tensor, keep_next: torch.Tensor | None,
          proj_clip: torch.Tensor) -> None:
    """Inference: the projection clipped into ``out`` (fp32), and into ``h_next``, the next step's
    recurrent input (in the products' type), zeroed where ``keep_next`` is False.

    Shape: h_raw (D, n, P), out (D, n, P), h_next (D, n, P), keep_next (1, n, 1).
    """
    h = h_raw.float().clamp(-proj_clip, proj_clip)  # (D, n, P)
    out.copy_(h)
    h_next.copy_((h if keep_next is None else torch.where(keep_next, h, 0.0)).to(h_next.dtype))


def train_forward(gx: torch.Tensor, r: torch.Tensor, c: torch.Tensor, cell_clip: torch.Tensor,
                  saved: tuple[torch.Tensor, ...], m_dtype: torch.dtype) -> torch.Tensor | None:
    """Training: ``cell`` (no reset), and what the backward multiplies by written into ``saved``:
    (m, o (1 - tanh(c)^2), tanh(c) o (1 - o), the gate factors [j i (1 - i), i (1 - j^2),
    c_prev f (1 - f)], f, whether the cell clip passed the gradient). Returns m in ``m_dtype``
    for the projection, or None in fp32 (the projection reads the saved m).

    Shape: gx, r (D, n, 4C), c (D, n, C) in place; saved (D, n, C) x 3, (D, n, 3C), (D, n, C),
    (D, n, C) bool -> m (D, n, C).
    """
    m_out, dc_factor, o_factor, gate_factor, f_gate, c_kept = saved
    D, n, C = c.shape
    gates = (gx.float() + r.float()).view(D, n, 4, C)
    i, j, f, o = gates[:, :, 0].sigmoid(), gates[:, :, 1].tanh(), gates[:, :, 2].sigmoid(), gates[:, :, 3].sigmoid()
    fc, ij = f * c, i * j  # (D, n, C)
    c_raw = fc + ij
    c_new = c_raw.clamp(-cell_clip, cell_clip)
    tc = torch.tanh(c_new)
    m = o * tc
    c.copy_(c_new)
    m_out.copy_(m)
    dc_factor.copy_(o - m * tc)
    o_factor.copy_(m - m * o)
    gate_factor.view(D, n, 3, C).copy_(torch.stack([ij - ij * i, i - ij * j, fc - fc * f], dim=2))
    f_gate.copy_(f)
    c_kept.copy_(c_new == c_raw)
    return None if m_dtype == torch.float32 else m.to(m_dtype)


def train_store(h_raw: torch.Tensor, out: torch.Tensor, h_next: torch.Tensor, h_kept: torch.Tensor,
                proj_clip: torch.Tensor) -> None:
    """Training: ``store``, and whether the projection clip passed the gradient.

    Shape: h_raw (D, n, P), out (D, n, P), h_next (D, n, P), h_kept (D, n, P) bool.
    """
    h = h_raw.float()
    h_new = h.clamp(-proj_clip, proj_clip)
    out.copy_(h_new)
    h_next.copy_(h_new.to(h_next.dtype))
    h_kept.copy_(h_new == h)


def train_backward_h(g_out: torch.Tensor, carry_h: torch.Tensor, h_kept: torch.Tensor, d_hraw: torch.Tensor,
                     m_dtype: torch.dtype) -> torch.Tensor | None:
    """Training backward, a step's first part: the gradient at the projection's output (the
    step's output gradient plus the state's), through the clip, saved in ``d_hraw``; returned in
    ``m_dtype`` for the product, or None in fp32 (the product reads ``d_hraw``).

    Shape: g_out, carry_h, h_kept, d_hraw (D, n, P).
    """
    dh = (g_out + carry_h) * h_kept
    d_hraw.copy_(dh)
    return None if m_dtype == torch.float32 else dh.to(m_dtype)


def train_backward_cell(dm: torch.Tensor, carry_c: torch.Tensor, saved: tuple[torch.Tensor, ...],
                        d_gates: torch.Tensor, m_dtype: torch.dtype) -> torch.Tensor | None:
    """Training backward, a step's second part: from the gradient at ``m`` to the gates' (written
    into ``d_gates``; returned in ``m_dtype`` for the product, None in fp32) and the previous
    cell state's (into ``carry_c``).

    Shape: dm (D, n, C), carry_c (D, n, C) in place, saved as ``train_forward``'s (this step's
    rows), d_gates (D, n, 4C).
    """
    _, dc_factor, o_factor, gate_factor, f_gate, c_kept = saved
    D, n, C = dm.shape
    dm = dm.float()
    dc = (carry_c + dm * dc_factor) * c_kept  # (D, n, C): at the cell before its clip
    gf = gate_factor.view(D, n, 3, C)
    g = torch.stack([dc * gf[:, :, 0], dc * gf[:, :, 1], dc * gf[:, :, 2], dm * o_factor], dim=2)  # (D, n, 4, C)
    d_gates.view(D, n, 4, C).copy_(g)
    carry_c.copy_(dc * f_gate)
    return None if m_dtype == torch.float32 else g.view(D, n, 4 * C).to(m_dtype)


KERNELS: dict[str, Callable[..., torch.Tensor | None]] = {  # FusedCell's fields, by name
    "cell": cell, "store": store, "train_forward": train_forward, "train_store": train_store,
    "train_backward_h": train_backward_h, "train_backward_cell": train_backward_cell}

# A kernel is compiled again for each kind of call (a step of one row, a prefix of the state buffer
# or all of it, with or without resets, each products' type): a handful per model. Dynamo's default
# limit of 8 per function would make a process that runs several models and precisions (a test
# session) fail (``fullgraph``): each set of kernels has this limit of its own, given to its compile
# calls (the process's dynamo settings are left as they are). A torch whose ``torch.compile`` takes
# no limit of its own (2.11, the lent GPU machines' image; the project pins 2.13) shares one cache a
# function among the sets, under the process's limit, raised to this one.
RECOMPILE_LIMIT = 64
_TAKES_OWN_LIMIT = "isolate_recompiles" in inspect.signature(torch.compile).parameters


def compile_kernel(fn: Callable[..., torch.Tensor | None]) -> Callable[..., torch.Tensor | None]:
    """``fn`` through ``torch.compile``: shapes dynamic (a step's rows vary), one graph, its own cache of
    compiled variants (``isolate_recompiles``) up to ``RECOMPILE_LIMIT`` (an older torch: the comment
    above); compiled on first call. A CPU kernel runs on the calling thread's torch threads
    (``cpp.dynamic_threads``), not on those of the thread that compiled it: the biLM's directions call
    the same kernels from threads of half the count (``inference.directions``)."""
    own = {"recompile_limit": RECOMPILE_LIMIT, "isolate_recompiles": True}
    if not _TAKES_OWN_LIMIT:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        own = {}
    return torch.compile(fn, dynamic=True, fullgraph=True, options={"cpp.dynamic_threads": True}, **own)


@dataclass(frozen=True)
class FusedCell:
    """The element-wise kernels of a step, compiled or not (module doc)."""

    cell: Callable[..., torch.Tensor]
    store: Callable[..., None]
    train_forward: Callable[..., torch.Tensor]
    train_store: Callable[..., None]
    train_backward_h: Callable[..., torch.Tensor]
    train_backward_cell: Callable[..., torch.Tensor]

    @classmethod
    def eager(cls) -> "FusedCell":
        return cls(**KERNELS)

    @classmethod
    def compile(cls) -> "FusedCell":
        """Each function through its own ``compile_kernel``; a fresh set each time, with caches of its
        own (``compiled`` is the process's one set)."""
        return cls(**{name: compile_kernel(fn) for name, fn in KERNELS.items()})

    @classmethod
    @functools.cache
    def compiled(cls) -> "FusedCell":
        """The process's one compiled set, built on first use."""
        return cls.compile()
