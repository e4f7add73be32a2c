"""What every part of the ONNX biLM graph reads while it is built: the model, the export spec, the
graph under construction, and how the spec's precision types a matrix product.

``onnx_char_cnn`` (token encoder), ``onnx_lstm`` (the recurrence) and ``onnx_graph`` (masks,
boundaries, assembly) each take a ``GraphContext``; only ``onnx_graph`` imports the other two.
"""
from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto

from elmo_core import BiLM
from elmo_core.kinds import Precision
from formats.export_spec import ExportSpec

from .onnx_builder import GraphBuilder

F32 = TensorProto.FLOAT


def np64(t: torch.Tensor) -> np.ndarray:
    """A parameter as float64 numpy (constants are rounded once, to their stored type)."""
    return t.detach().cpu().double().numpy()


class GraphContext:
    """The model and spec being exported, the main graph's builder, and the boundary tokens.

    Shape: boundaries (2, P) float64: the representations of <S> and </S>.
    """

    def __init__(self, model: BiLM, spec: ExportSpec) -> None:
        self.model, self.spec, self.cfg = model, spec, model.config
        self.g = GraphBuilder(spec.opset)
        self.mm_type = getattr(TensorProto, Precision.of(spec.precision).onnx)
        self.boundaries = np64(model.encoder.boundary_embeddings())  # (2, P)

    def weight(self, value: np.ndarray, base: str, g: GraphBuilder | None = None) -> str:
        """A matmul weight stored in the precision's matmul type."""
        return (g or self.g).typed_const(value, self.mm_type, base)

    def matmul(self, x: str, w: str, g: GraphBuilder | None = None) -> str:
        """float32 in and out; the product itself runs in the precision's type."""
        g = g or self.g
        if self.mm_type == F32:
            return g.op("MatMul", [x, w])
        y = g.op("MatMul", [g.cast(x, self.mm_type), w])
        return g.cast(y, F32)
