"""Backends run the biLM on character ids; the Embedder and the pipelines only see this interface.

A backend is a context manager with ``run(char_ids) -> (layers, mask)`` on numpy arrays:
char_ids (B, T, C) int32 without boundary tokens -> layers (B, L+1, T, 2P) float32, mask (B, T) bool;
and ``run_combined(char_ids, weights, dtype) -> (sum_j weights[j] * layer_j (B, T, 2P), mask)``;
``submit(char_ids, request, keep, prepared)`` is what the engine (``inference.engine``) calls: the
whole ``VectorRequest`` (output mode, pooling, normalisation, dtype) done where the backend
computes, from ``prepare(char_ids)``'s host work where the backend has any (the engine makes the
next batch's while this one runs where ``stages_ahead``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

from elmo_core import BiLM, ElmoConfig, StatefulBiLM
from elmo_core.bilm import Tokenizer
from elmo_core.chars import ByteTokenizer
from elmo_core.bounds import check_count
from elmo_core.errors import ElmoError, InputError, SettingError
from elmo_core.host_to_device import to_device
from elmo_core.kinds import Dtype, Precision
from elmo_core.names import LAYOUTS
from formats import load_bilm
from formats.model_dir import load_tokenizer
from formats.token_embeddings import read_token_embeddings
from runtime import CpuBudget, use_threads
from runtime.settings import apply_threads

from .fast_lstm import PACKED_MIN_WEIGHTS
from .fast_path import FastInference
from .host_batch import HostBatch
from .host_copy import PinnedCopies
from .outputs import combine_layers, finish_on_device, reduce_on_device
from elmo_core.vectors import VectorRequest
from .precision import check_precision
from .row_lstm import RowShape
from .token_cache import TokenCache, preload_token_cache

RUN_LAYOUTS = tuple(name for name in LAYOUTS if name != "auto")  # what a backend runs


class Backend(Protocol):
    config: ElmoConfig
    name: str
    stages_ahead: bool  # the engine prepares the next batch on a thread while this one runs

    def run(self, char_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def run_combined(self, char_ids: np.ndarray, weights: np.ndarray,
                     dtype: np.dtype | type = np.float32) -> tuple[np.ndarray, np.ndarray]: ...

    def prepare(self, char_ids: np.ndarray) -> object | None: ...

    def abandon(self, prepared: object | None) -> None: ...

    def submit(self, char_ids: np.ndarray, request: VectorRequest, keep: np.ndarray | None = None,
               prepared: object | None = None, take: np.ndarray | None = None) -> Callable[[], np.ndarray]: ...

    def warm_shapes(self, most_sentences: int) -> list[int]: ...

    def close(self) -> None: ...

    def __enter__(self) -> "Backend": ...

    def __exit__(self, *exc: object) -> None: ...


class BackendBase:
    """Context-manager plumbing and the generic ``run_combined`` shared by every backend."""

    name = "base"
    stages_ahead = False
    config: ElmoConfig
    artifact_dir: Path | None = None  # an export's directory: a dictionary model's dictionaries are there

    @property
    def tokenizer(self) -> Tokenizer:
        """Sentences -> the token ids ``run`` takes: ``tokenizer.batch(sentences)`` (B, T, W)."""
        if getattr(self, "_tokenizer", None) is None:
            if self.config.dictionaries is None:
                self._tokenizer = ByteTokenizer(self.config.char_cnn.max_characters_per_token)
            elif self.artifact_dir is None:
                raise ElmoError(f"{self.name}: a dictionary model's backend needs the directory of its dictionaries")
            else:
                self._tokenizer = load_tokenizer(self.config, self.artifact_dir)
        return self._tokenizer

    def run(self, char_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def warm_shapes(self, most_sentences: int) -> list[int]:
        """Prepare every static shape batches of at most ``most_sentences`` sentences may take (a
        server, before it says it is ready); the row counts held (none where shapes are free)."""
        return []

    def run_combined(self, char_ids: np.ndarray, weights: np.ndarray,
                     dtype: np.dtype | type = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """``sum_j weights[j] * layer_j`` (see ``elmo_core.vectors.layer_weights``), in ``dtype``.

        Shape: char_ids (B, T, C), weights (L+1,) -> (B, T, 2P), mask (B, T).
        """
        layers, mask = self.run(char_ids)
        return combine_layers(layers, weights).astype(dtype, copy=False), mask

    def check_request(self, request: VectorRequest) -> None:
        """Refuse, before any work, a request this backend cannot compute (every backend with the
        layers can compute any; see ``OnnxBackend`` for a mixed export)."""
        request.weights(self.config.n_output_layers)  # the mix's length against the model's layers

    def prepare(self, char_ids: np.ndarray) -> object | None:
        """A batch's host work that can be done before its ``submit`` (``prepared``), while the
        previous batch runs; None where the backend has none. Shape: char_ids (B, T, C)."""
        return None

    def abandon(self, prepared: object | None) -> None:
        """A ``prepare``'d batch that will not be submitted."""

    def submit(self, char_ids: np.ndarray, request: VectorRequest, keep: np.ndarray | None = None,
               prepared: object | None = None, take: np.ndarray | None = None) -> Callable[[], np.ndarray]:
        """A batch's vectors as ``request`` asks (``inference.outputs``: the output mode, then pooled
        partials over ``keep``, or the tokens ``take`` names to unit length, in its dtype),
        started: the callable returns them.
        Here on the host (torch on CPU over ``run`` / ``run_combined``'s arrays); a backend on a GPU
        does it on the device and returns before the device is done (see ``TorchBackend``). A
        result must be read before two more batches are submitted.

        Shape: char_ids (B, T, C), keep (B, T) bool (pooling), take (n,) flat positions b*T+t (tokens)
        -> (n, [L+1,] D) ((B, T, [L+1,] D) without ``take``), or (B, [L+1,] D) pooled.
        """
        weights = request.weights(self.config.n_output_layers)
        if weights is not None:
            combined, _ = self.run_combined(char_ids, weights)  # (B, T, D)
            x = torch.from_numpy(combined)
        else:
            layers, mask = self.run(char_ids)  # (B, L+1, T, D)
            x = reduce_on_device(torch.from_numpy(layers), torch.from_numpy(mask), request)  # (B, T, [L+1,] D)
        result = finish_on_device(x, request, None if keep is None else torch.from_numpy(keep),
                                  None if take is None else torch.from_numpy(take)).numpy()
        return lambda: result

    def device_report(self) -> dict:
        """What the device holds, for a job's manifest (a GPU backend's memory; empty on a CPU)."""
        return {}

    def close(self) -> None:
        pass

    def __enter__(self) -> "BackendBase":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TorchBackend(BackendBase):
    """The PyTorch biLM. ``stateful=True`` carries each row's state across calls (original's mode).

    ``token_cache``: how many distinct tokens' char-CNN outputs to keep across calls (0: none).
    ``token_embeddings``: a token-embedding file (``elmo dump-tokens``, or the original's with its
    ``token_vocab``) whose tokens skip the char-CNN, besides the ``token_cache`` ones.
    ``precision``: fp32, tf32 (CUDA), bf16 or fp16 matrix products (``inference.precision``): a
    name, checked here, or the record ``check_precision`` returned where it was resolved.
    ``cuda_graphs``: the stateless recurrence of ``run_combined`` over rows of one static shape,
    replayed as one CUDA graph (``inference.cuda_graphs``); default on for a CUDA device.
    ``layout``: how the recurrence runs (``inference.layout``: ``packed``, ``fused``, ``rows``, as a
    run resolved it; ``auto`` is the run's to settle, refused here); None: the device's default, as
    ``cuda_graphs`` says. ``rows``: the ``rows`` layout's most rows a step (None: ``RowShape()``'s);
    on a CPU its windows run eagerly. ``onednn``: the ``packed`` layout's products all on packed
    oneDNN weights (else from ``fast_lstm.PACKED_MIN_WEIGHTS`` up), as a CPU's measurement chose
    (``inference.layout.Layout``).
    """

    name = "torch"

    def __init__(self, model: BiLM, stateful: bool = False, threads: int | CpuBudget | None = None,
                 device: str = "cpu", token_cache: int = 50_000, token_embeddings: str | Path | None = None,
                 token_vocab: str | Path | None = None, precision: str | Precision = "fp32",
                 cuda_graphs: bool | None = None, layout: str | None = None, rows: int | None = None,
                 onednn: bool = False) -> None:
        _check_layout(layout)
        check_count("token_cache", token_cache, 0, zero="none kept")
        check_count("rows", rows, optional="RowShape()'s")
        precision = precision if isinstance(precision, Precision) else check_precision(precision, device)
        is_cuda = torch.device(device).type == "cuda"
        if cuda_graphs and not is_cuda:
            raise InputError(f"cuda_graphs needs a CUDA device, got {device!r}")
        apply_threads(threads) if isinstance(threads, CpuBudget) else use_threads(threads)
        if token_vocab is not None and token_embeddings is None:
            raise InputError("token_vocab (--token-vocab) names the rows of a token-embedding file; pass that file too")
        self.model = model.eval().to(device)
        cache = TokenCache(token_cache) if token_cache > 0 or token_embeddings is not None else None
        if token_embeddings is not None:
            preload_token_cache(self.model, read_token_embeddings(token_embeddings, token_vocab), cache)
        graphs = (is_cuda if cuda_graphs is None else cuda_graphs) and not stateful
        if layout == "rows" and (stateful or (is_cuda and not graphs)):  # a row's state carried, or graphs off
            layout = "fused"
        self.fast = FastInference(self.model, precision, cache, cuda_graphs=graphs and layout is None, layout=layout,
                                  capture=is_cuda, rows=RowShape(rows) if rows else RowShape(),
                                  packed_min_weights=0 if onednn else PACKED_MIN_WEIGHTS)
        self.model.use_fast_path(self.fast)
        self.device = torch.device(device)
        self.config = model.config
        self.stateful = StatefulBiLM(self.model) if stateful else None
        self._copies = PinnedCopies()  # used on CUDA only
        self.stages_ahead = self.device.type == "cuda"  # a GPU computes off the host's cores

    @classmethod
    def from_files(cls, path: str | Path, weights: str | Path | None = None, **kw: object) -> "TorchBackend":
        return cls(load_bilm(path, weights), **kw)  # type: ignore[arg-type]

    @property
    def tokenizer(self) -> Tokenizer:
        return self.model.tokenizer

    def run(self, char_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = to_device(char_ids, self.device)
        with self.fast.running():
            out = self.stateful.run(ids) if self.stateful else self.model.run(ids)
        return out.layers.float().cpu().numpy(), out.mask.cpu().numpy()

    def run_combined(self, char_ids: np.ndarray, weights: np.ndarray,
                     dtype: np.dtype | type = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """The layers combined on the device before the copy, and copied in ``dtype`` (stateless;
        a stateful backend combines after ``run``)."""
        if self.stateful:
            return super().run_combined(char_ids, weights, dtype)
        combined, mask = self._combined_on_device(char_ids, weights, dtype)
        return combined.cpu().numpy(), mask.cpu().numpy()

    def prepare(self, char_ids: np.ndarray) -> HostBatch | None:
        """The batch's host work (``FastInference.prepare``: lengths, distinct tokens, the token
        cache's plan, the char-CNN's chunks, the rows), so that its device work reads nothing
        back; None when stateful."""
        return None if self.stateful else self.fast.prepare(char_ids)

    def abandon(self, prepared: object | None) -> None:
        if isinstance(prepared, HostBatch):
            self.fast.abandon(prepared)

    def submit(self, char_ids: np.ndarray, request: VectorRequest, keep: np.ndarray | None = None,
               prepared: object | None = None, take: np.ndarray | None = None) -> Callable[[], np.ndarray]:
        """The request computed on the device (the mix while the layers are packed; pooling,
        normalisation and the dtype before the copy; of tokens, only those ``take`` names cross)
        from the host's plan of the batch (``prepare``'s, made here where not given). On CUDA the
        inputs cross through pinned memory, the work and its copy to pinned host memory are queued
        and this returns: the host waits for nothing but the result, and the next batch is
        launched while this one's result is read out."""
        if self.stateful:
            return super().submit(char_ids, request, keep, take=take)
        plan = prepared if isinstance(prepared, HostBatch) else self.fast.prepare(char_ids)
        ids = torch.from_numpy(char_ids)  # only its shape is read: the plan holds the batch
        weights = request.weights(self.config.n_output_layers)
        tokens = None if take is None else to_device(take, self.device)  # (n,)
        taken = tokens is not None and weights is not None and request.pool is None  # straight from the packed rows
        with self.fast.running(), self.fast.batch(plan):
            if weights is not None:
                x, _ = self.model.run_combined(ids, to_device(weights, self.device), tokens if taken else None)
            else:
                out = self.model.run(ids)
                x = reduce_on_device(out.layers.float(), out.mask, request)  # (B, T, [L+1,] D)
            result = finish_on_device(x, request, None if keep is None else to_device(keep, self.device),
                                      None if taken else tokens)  # from x (B, T, [L+1,] D), or (n, D) taken
            if self.device.type != "cuda":
                host = result.numpy()
                return lambda: host
            return self._copies.start(result)

    def _combined_on_device(self, char_ids: np.ndarray, weights: np.ndarray,
                            dtype: np.dtype | type) -> tuple[torch.Tensor, torch.Tensor]:
        """Shape: char_ids (B, T, C), weights (L+1,) -> (B, T, 2P) in ``dtype``, mask (B, T), on the device."""
        ids = to_device(char_ids, self.device)
        with self.fast.running():
            combined, mask = self.model.run_combined(ids, to_device(weights, self.device))  # (B, T, 2P)
            return combined.to(Dtype.of_numpy(dtype).torch), mask

    def warm_shapes(self, most_sentences: int) -> list[int]:
        """The CUDA graphs of every row count (``RowGraphs.warm``)."""
        if self.fast.graphs is None:
            return []
        with self.fast.running():
            return self.fast.graphs.warm(most_sentences)

    @property
    def precision(self) -> str:
        return self.fast.precision

    def device_report(self) -> dict:
        """On CUDA: peak GPU memory allocated and reserved, and the CUDA graphs kept, captured, replayed."""
        if self.device.type != "cuda":
            return {}
        report = {"gpu_peak_allocated_bytes": torch.cuda.max_memory_allocated(self.device),
                  "gpu_peak_reserved_bytes": torch.cuda.max_memory_reserved(self.device)}
        graphs = self.fast.graphs
        if graphs is not None:
            report["cuda_graphs"] = {"rows": sorted(graphs.windows), "steps": graphs.shape.steps,
                                     "captured": graphs.captures, "replayed": graphs.replays,
                                     "padded_fraction": graphs.padded / max(graphs.positions, 1),
                                     "buffer_bytes": graphs.memory_bytes()}
        return report

    def reset_state(self) -> None:
        if self.stateful is None:
            raise ElmoError("reset_state: this backend is stateless")
        self.stateful.reset()


def _check_layout(layout: str | None) -> None:
    """A layout the backend runs: ``auto`` is a run's choice (``inference.layout``: measured once per
    CPU, ``rows`` on CUDA), settled before a backend opens; unsettled here it would run ``fused``."""
    if layout == "auto":
        raise SettingError("`layout` auto is settled by the run (measured once per CPU, rows on CUDA): open "
                           "the model with Embedder.open(model, layout=\"auto\") or resolve_run(model, "
                           f"layout=\"auto\").open(), or pass one of {RUN_LAYOUTS} (None: the device's default)")
    if layout is not None and layout not in RUN_LAYOUTS:
        raise SettingError(f"`layout` must be None (the device's default) or one of {RUN_LAYOUTS}, got {layout!r}")
