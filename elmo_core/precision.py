"""Inference precision of the matrix products: fp32, tf32 (CUDA), bf16, fp16.

Only the matrix products change. In bf16 / fp16 the LSTM's products (input, recurrent, projection)
take inputs rounded to that type, from weight copies made once, and their results come back in
fp32; the cell state, the gate nonlinearities, both clips, the residual sums and the mix stay in
fp32. The char-CNN (convolutions, highway, projection) runs under ``torch.autocast`` in that type
and its output is fp32. tf32 keeps every tensor fp32 and lets the GPU's tensor cores round the
products' inputs to tf32 (CUDA only: a CPU has no tf32 mode).

Parity (issue's rule, tested): fp32 on a GPU within 1e-3 of the CPU; tf32, bf16 and fp16 every
token's cosine >= 0.999 against CPU fp32, every layer.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from .errors import InputError
from .names import PRECISIONS

_MATMUL_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: str | torch.device) -> None:
    """Refuse an unknown precision, or tf32 off CUDA."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if precision == "tf32" and torch.device(device).type != "cuda":
        raise InputError(f"precision tf32 is a CUDA tensor-core mode; on {device} use fp32 (or bf16 / fp16)")


def matmul_dtype(precision: str) -> torch.dtype:
    """The type the matrix products' inputs are rounded to by us (tf32: by the GPU, so fp32 here)."""
    check_precision(precision, "cuda")
    return _MATMUL_DTYPES[precision]


@contextlib.contextmanager
def tf32_products(enabled: bool) -> Iterator[None]:
    """CUDA products and convolutions in tf32 inside the block; the previous settings after it."""
    if not enabled:
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def low_bmm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a @ w`` with ``a`` rounded to ``w``'s type, the result in ``a``'s type (no casts when the
    types agree).

    Shape: a (D, N, K), w (D, K, M) -> (D, N, M).
    """
    return torch.bmm(a.to(w.dtype), w).to(a.dtype)
