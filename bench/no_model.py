"""``bench_host.py --no-model``: the model's compute taken off the host, as a GPU takes it.

On a GPU box the model's steps run on the device; the host prepares each batch (character ids, the
token cache's plan, the rows: ``TorchBackend.prepare``, kept here as it is), launches it and copies
its output back. ``install()`` replaces ``TorchBackend.submit`` in this process by that host part
alone: the batch's plan made a batch ahead on a thread (``stages_ahead``, as on CUDA) or here if not
given, then its token vectors read from a host array of random
full-width values (values that compress as a model's do), so every stage after the model (placing,
encoding, writing) does the work of a real job. The device-to-host copy costs the host nothing
here, as on CUDA: ``TorchBackend`` copies a batch's result by DMA into page-locked buffers it reuses
(``inference.host_copy.PinnedCopies``), and the host reads them in place. Token vectors only (``elmo embed``'s default request); a pooled request is refused.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from inference.backends import TorchBackend

_DEVICE: dict[tuple, np.ndarray] = {}


_RANDOM_ROWS = 4096  # rows drawn at random; more are these repeated (a copy, not the generator's time)


def _device_values(rows: int, trailing: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """At least ``rows`` rows of random values of one output shape and dtype, made once and grown
    (to twice what is asked, so a job of growing batches grows it a few times, not every batch)."""
    key = (trailing, np.dtype(dtype).str)
    have = _DEVICE.get(key)
    if have is None:
        rng = np.random.default_rng(0)
        have = rng.standard_normal((_RANDOM_ROWS, *trailing), dtype=np.float32).astype(dtype)
    if len(have) < rows:
        have = np.resize(have[:_RANDOM_ROWS], (2 * rows, *trailing))  # the random rows, repeated
    _DEVICE[key] = have
    return have


def _submit(self: TorchBackend, char_ids: np.ndarray, request, keep: np.ndarray | None = None,
            prepared: object | None = None, take: np.ndarray | None = None) -> Callable[[], np.ndarray]:
    if take is None or request.pool is not None:
        raise SystemExit("--no-model times token vectors only (no pooling)")
    if prepared is None:
        self.prepare(char_ids)
    trailing = request.mode.shape(self.config.n_output_layers, self.config.output_dim)
    host = _device_values(len(take), trailing, request.dtype)[:len(take)]  # (n, [L+1,] D): the pinned buffer, read in place
    return lambda: host


def install() -> None:
    made = TorchBackend.__init__

    def __init__(self: TorchBackend, *args, **kwargs) -> None:
        made(self, *args, **kwargs)
        self.stages_ahead = True

    TorchBackend.__init__ = __init__  # type: ignore[method-assign]
    TorchBackend.submit = _submit  # type: ignore[method-assign]
