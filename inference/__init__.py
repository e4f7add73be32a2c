"""Running a biLM: the one engine (batches, outputs, pooling), the fast inference path (fast_path.py), the backends (torch, ONNX Runtime, TensorRT) and their registry.
May import: elmo_core, runtime, corpora, formats (tests/test_layers.py)."""
from __future__ import annotations

import importlib
from typing import Any

import elmo_core  # noqa: F401  (first: it settles the process's environment before torch loads: elmo_core.process_env)

# Each name's module, imported on first use: importing the package loads no model code (the CLI's
# parsers and --help answer at once).
_HOMES = {
    "Backend": "backends", "BackendBase": "backends", "TorchBackend": "backends", "BatchPolicy": "batching",
    "Elmo": "elmo_module", "ElmoMix": "elmo_module", "Embedder": "embedder", "OUTPUT_MODES": "outputs",
    "combine_layers": "outputs", "layer_weights": "outputs", "reduce_layers": "outputs"
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value
