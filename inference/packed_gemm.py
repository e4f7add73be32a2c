"""Pre-packed oneDNN weights for the inference GEMMs on x86 CPUs.

The recurrent step multiplies a small batch (M <= 64 rows) by a 512 x 16384 matrix; oneDNN with
weights reordered once into its blocked layout runs that noticeably faster than the default
BLAS call on these CPUs. Same arithmetic (fp32 accumulate); inference only (no autograd). In bf16
(weights and inputs), oneDNN runs AMX or AVX512-BF16 kernels where the CPU has them.
Callers check ``packed_gemm_available`` and use a plain batched matmul where it is False.
"""
from __future__ import annotations

from typing import Iterable

import torch


def weights_key(params: Iterable[torch.Tensor]) -> tuple:
    """What a copy made from ``params`` (packed weights, reduced-precision copies, cached char-CNN
    outputs) stays valid for: each tensor's in-place version and storage; a new key, a stale copy."""
    return tuple((p._version, p.data_ptr()) for p in params)


def packed_gemm_available(device: torch.device) -> bool:
    return (device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear:
    """``x @ weight`` with ``weight`` (K, N) as the original stores it, reordered once.

    Shape: x (M, K) -> (M, N).
    """

    def __init__(self, weight: torch.Tensor, batch_hint: int = 64) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.t().contiguous(), batch_hint)  # (N, K) blocked

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight (+ bias)``, in x's type (bias may be fp32 for a bf16 x: added before rounding)."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """``x @ weight + other`` in one GEMM (the sum rounded once to x's type). Shape: other (M, N)."""
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.packed, None, "add")
