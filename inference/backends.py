"""Backends run the biLM on character ids; the Embedder and the pipelines only see this interface.

A backend is a context manager with ``run(char_ids) -> (layers, mask)`` on numpy arrays:
char_ids (B, T, C) int32 without boundary tokens -> layers (B, L+1, T, 2P) float32, mask (B, T) bool.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from elmo_core import BiLM, ElmoConfig, StatefulBiLM, load_bilm
from elmo_core.errors import ElmoError
from elmo_core.token_cache import TokenCache


class Backend(Protocol):
    config: ElmoConfig
    name: str

    def run(self, char_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def close(self) -> None: ...

    def __enter__(self) -> "Backend": ...

    def __exit__(self, *exc: object) -> None: ...


class BackendBase:
    """Context-manager plumbing shared by every backend."""

    name = "base"
    config: ElmoConfig

    def close(self) -> None:
        pass

    def __enter__(self) -> "BackendBase":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TorchBackend(BackendBase):
    """The PyTorch biLM. ``stateful=True`` carries each row's state across calls (original's mode).

    ``token_cache``: how many distinct tokens' char-CNN outputs to keep across calls (0: none).
    """

    name = "torch"

    def __init__(self, model: BiLM, stateful: bool = False, threads: int | None = None,
                 device: str = "cpu", token_cache: int = 50_000) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.model = model.eval().to(device)
        self.model.token_cache = TokenCache(token_cache) if token_cache > 0 else None
        self.device = torch.device(device)
        self.config = model.config
        self.stateful = StatefulBiLM(self.model) if stateful else None

    @classmethod
    def from_files(cls, path: str | Path, weights: str | Path | None = None, **kw: object) -> "TorchBackend":
        return cls(load_bilm(path, weights), **kw)  # type: ignore[arg-type]

    def run(self, char_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = torch.from_numpy(np.ascontiguousarray(char_ids)).to(self.device)
        with torch.inference_mode():
            out = self.stateful.run(ids) if self.stateful else self.model.run(ids)
        return out.layers.float().cpu().numpy(), out.mask.cpu().numpy()

    def reset_state(self) -> None:
        if self.stateful is None:
            raise ElmoError("reset_state: this backend is stateless")
        self.stateful.reset()
