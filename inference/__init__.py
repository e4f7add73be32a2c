"""Running a biLM: the one engine (batches, outputs, pooling), the fast inference path (fast_path.py), the backends (torch, ONNX Runtime, TensorRT) and their registry.
May import: elmo_core, storage, runtime, corpora, formats (tests/test_layers.py)."""
from __future__ import annotations

from elmo_core.lazy_names import lazy_names
from elmo_core.process_env import settle

settle()  # before any module here loads torch: the environment torch reads when it loads (elmo_core/process_env.py)

# Each name's module, imported on first use (elmo_core.lazy_names).
_HOMES = {
    "Backend": "backends", "BackendBase": "backends", "TorchBackend": "backends", "BatchPolicy": "batching",
    "Elmo": "elmo_module", "ElmoMix": "elmo_module", "Embedder": "embedder",
    "combine_layers": "outputs", "reduce_layers": "outputs"
}

__all__ = list(_HOMES)

__getattr__ = lazy_names(__name__, _HOMES, globals())
