"""Pre-packed oneDNN weights for the inference GEMMs on x86 CPUs.

The recurrent step multiplies a small batch (M <= 64 rows) by a 512 x 16384 matrix; oneDNN with
weights reordered once into its blocked layout runs that noticeably faster than the default
BLAS call on these CPUs. Same arithmetic (fp32 accumulate); inference only (no autograd).
Where the op is missing (other builds, GPUs) ``PackedLinear`` falls back to a plain matmul.
"""
from __future__ import annotations

import torch


def packed_gemm_available(device: torch.device) -> bool:
    return (device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear:
    """``x @ weight + bias`` with ``weight`` (K, N) as the original stores it.

    Shape: x (M, K) -> (M, N).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, batch_hint: int = 64) -> None:
        self.weight, self.bias = weight, bias
        self.packed = None
        if packed_gemm_available(weight.device):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.t().contiguous(), batch_hint)  # (N, K) blocked
            self.bias = None if bias is None else bias.contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return x @ self.weight if self.bias is None else torch.addmm(self.bias, x, self.weight)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
