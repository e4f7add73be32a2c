"""Device-to-host copies through pinned memory that overlap the next batch's work.

``PinnedCopies.start(tensor)`` queues the copy of a device tensor into a page-locked host buffer on
the current stream and returns at once; the returned callable waits for that copy only and gives
the numpy array. Buffers are reused in turn (``slots``, default 2), so a result must be read out
before ``slots`` more copies are started: one batch pending while the next one runs.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch


class PinnedCopies:
    def __init__(self, slots: int = 2) -> None:
        self.buffers: list[torch.Tensor | None] = [None] * slots
        self.turn = 0

    def start(self, tensor: torch.Tensor) -> Callable[[], np.ndarray]:
        """Shape: any device tensor -> a callable giving it as numpy (same shape and dtype)."""
        slot = self.turn % len(self.buffers)
        self.turn += 1
        nbytes = tensor.numel() * tensor.element_size()
        buf = self.buffers[slot]
        if buf is None or buf.numel() < nbytes:
            buf = self.buffers[slot] = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, pin_memory=True)
        host = buf[:nbytes].view(tensor.dtype).view(tensor.shape)
        host.copy_(tensor, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(tensor.device))  # the copy's device, whichever is current

        def result() -> np.ndarray:
            done.synchronize()
            return host.numpy()
        return result

