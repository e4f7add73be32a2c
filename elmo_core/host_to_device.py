"""Host data to the device without making the host wait: through pinned memory, non-blocking.

A copy from pageable memory to a CUDA device waits for the device's stream; from pinned memory it is
queued and the host goes on (the caching host allocator keeps the pinned block until the copy is done).
On the CPU the tensor is returned as it is.
"""
from __future__ import annotations

import numpy as np
import torch


def to_device(t: torch.Tensor | np.ndarray, device: torch.device | str) -> torch.Tensor:
    """Shape: any host tensor (or numpy array) -> the same on ``device``."""
    t = torch.from_numpy(np.ascontiguousarray(t)) if isinstance(t, np.ndarray) else t
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def index_to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """Shape: a host list of ints -> (n,) int64 on ``device``."""
    return to_device(torch.tensor(values, dtype=torch.long), device)
