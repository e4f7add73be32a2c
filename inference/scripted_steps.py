"""A layer's recurrence over a chunk of steps as one TorchScript function, for models whose steps are
small kernels (fp32 on a CPU, plain products: ``fast_lstm.packed_products`` False).

Why: a small model's step is ~10 kernels of a few microseconds each (a 134 x 512 by 512 x 32
product, sigmoids over 134 x 32 floats), so Python's dispatch of each one is most of the step; the
directions' two threads (``inference.directions``) then take turns holding the GIL rather than run
at once. TorchScript's interpreter runs the loop without the GIL. Measured on a 2-core Zen 5, a
512 x 32 LSTM, 134 rows a step, both directions on their own threads: 163-170 us a step (wall) run
from Python, 102 us here; one direction alone 94-102 against 83-85 us.

Same maths as ``fast_lstm.lstm_step_inplace`` (TF gate order i, j, f, o; the cell clipped, then
the projection, then its clip); ATen's tanh instead of numpy's (both within 6e-8 of the exact
value); where the cell is narrow (``WHOLE_SIGMOID_MAX_CELL``), j's tanh is taken first into a
buffer of its own and the sigmoid runs over the whole contiguous gate row, faster than three
strided slices (1.48x the element-wise part at C = 8, 1.05x at 128, 0.98x at 1,024, 0.87x at
4,096). Tested against the reference in tests/inference/test_scripted_steps.py.
"""
from __future__ import annotations

import functools
import threading
import warnings
from typing import Callable, List, Optional

import torch

# The widest cell (C) whose gates take one sigmoid over the whole row (module doc).
WHOLE_SIGMOID_MAX_CELL = 256


def _run_chunk(gx: torch.Tensor, first: int, prev: torch.Tensor, c: torch.Tensor, w_state: torch.Tensor,
               w_proj: torch.Tensor, out: torch.Tensor, starts: List[int], rows: List[int], shared_first: bool,
               cell_clip: Optional[float], proj_clip: Optional[float], whole_sigmoid: bool) -> torch.Tensor:
    """The steps ``starts``/``rows`` (packed offsets, active rows) whose input parts ``gx`` holds from
    packed row ``first`` on; each step's output into its rows of ``out`` (read back as the next
    step's recurrent input), ``c`` updated in place. Returns the recurrent input of the step after.

    Shape: gx (D, R, 4C), prev (D, >= n, P), c (D, B, C), w_state (D, P, 4C), w_proj (D, C, P),
    out (D, N, P) -> (D, >= n', P).
    """
    C = c.shape[-1]
    for k in range(len(starts)):
        s, n = starts[k], rows[k]
        g = torch.baddbmm(gx[:, s - first : s - first + n], prev[:, :n], w_state)  # (D, n, 4C)
        if whole_sigmoid:
            j = torch.tanh(g[:, :, C : 2 * C])  # (D, n, C)
            g.sigmoid_()
        else:
            g[:, :, :C].sigmoid_()
            j = g[:, :, C : 2 * C].tanh_()
            g[:, :, 2 * C :].sigmoid_()
        cn = c[:, :n]  # (D, n, C): f c + i j, in place
        cn.mul_(g[:, :, 2 * C : 3 * C]).addcmul_(g[:, :, :C], j)
        if cell_clip is not None:
            cn.clamp_(-cell_clip, cell_clip)
        dest = out[:, s : s + n]  # (D, n, P)
        torch.bmm(g[:, :, 3 * C :].mul_(torch.tanh(cn, out=j)), w_proj, out=dest)
        if proj_clip is not None:
            dest.clamp_(-proj_clip, proj_clip)
        if shared_first and s == 0:  # step 0 ran one row: its state holds for every row
            c[:, 1:].copy_(c[:, :1].expand(c.shape[0], c.shape[1] - 1, C))
            prev = dest.expand(c.shape[0], c.shape[1], dest.shape[2])
        else:
            prev = dest
    return prev


_SCRIPTING = threading.Lock()  # one compilation a process, whichever thread asks first


def scripted_chunk() -> Callable[..., torch.Tensor] | None:
    """``_run_chunk`` compiled by TorchScript once a process; None where this torch cannot script
    it (the caller then runs its Python loop)."""
    with _SCRIPTING:
        return _script()


@functools.cache
def _script() -> Callable[..., torch.Tensor] | None:
    """TorchScript is deprecated in favour of ``torch.compile``, which unrolls a loop of
    data-dependent length: its warning is not the user's (silenced under ``_SCRIPTING``: the
    warnings filters are the process's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return torch.jit.script(_run_chunk)
        except (RuntimeError, OSError, AttributeError):  # no source (frozen), a torch without the JIT
            return None
