"""Running a biLM: the one engine (batches, outputs, pooling), the fast inference path (fast_path.py), the backends (torch, ONNX Runtime, TensorRT) and their registry.
May import: elmo_core, runtime, corpora, formats (tests/test_layers.py)."""
import elmo_core  # noqa: F401  (first: it settles the process's environment before torch loads: elmo_core.process_env)
from .backends import Backend, BackendBase, TorchBackend
from .batching import BatchPolicy
from .elmo_module import Elmo, ElmoMix
from .embedder import Embedder
from .outputs import OUTPUT_MODES, combine_layers, layer_weights, reduce_layers

__all__ = ["Backend", "BackendBase", "BatchPolicy", "TorchBackend", "Embedder", "Elmo", "ElmoMix", "OUTPUT_MODES", "combine_layers", "layer_weights", "reduce_layers"]
