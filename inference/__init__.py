"""Run a biLM with PyTorch, ONNX Runtime or TensorRT behind one interface."""
from .backends import Backend, BackendBase, TorchBackend
from .elmo_module import Elmo, ElmoMix
from .embedder import Embedder
from .outputs import OUTPUT_MODES, combine_layers, layer_weights, reduce_layers

__all__ = ["Backend", "BackendBase", "TorchBackend", "Embedder", "Elmo", "ElmoMix", "OUTPUT_MODES", "combine_layers", "layer_weights", "reduce_layers"]
