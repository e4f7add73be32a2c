"""A small ONNX graph-building helper: unique names, constants as initializers, opset-aware reductions."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DTYPE_NAMES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
               "int32": TensorProto.INT32, "int64": TensorProto.INT64, "bool": TensorProto.BOOL}


class GraphBuilder:
    """Collects nodes and initializers; names are unique; reductions follow the opset's signature."""

    def __init__(self, opset: int, prefix: str = "") -> None:
        self.opset = opset
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def fresh(self, base: str) -> str:
        self._count += 1
        return f"{self.prefix}{base}_{self._count}"

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs: object) -> str | list[str]:
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.fresh(op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def rename(self, old: str, new: str) -> None:
        """Give a node output a fixed name (a graph output), everywhere it is produced and read."""
        for node in self.nodes:
            for names in (node.output, node.input):
                for k, name in enumerate(names):
                    if name == old:
                        names[k] = new

    def const(self, value: np.ndarray | float | int | list, base: str = "const", dtype: object = None) -> str:
        """An initializer (constants are initializers: some TensorRT importers require that)."""
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def typed_const(self, value: np.ndarray, onnx_type: int, base: str) -> str:
        """An initializer of any ONNX float type (bfloat16 too, which numpy lacks)."""
        name = self.fresh(base)
        if onnx_type == TensorProto.BFLOAT16:
            tensor = helper.make_tensor(name, onnx_type, value.shape, _to_bf16_bits(value), raw=True)
        else:
            numpy_type = np.float16 if onnx_type == TensorProto.FLOAT16 else np.float32
            tensor = numpy_helper.from_array(np.asarray(value, numpy_type), name)
        self.initializers.append(tensor)
        return name

    def reduce(self, op_type: str, x: str, axes: list[int], keepdims: int = 0) -> str:
        """ReduceSum takes axes as an input from opset 13, the other reductions from opset 18."""
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.op(op_type, [x, self.const(np.array(axes, np.int64), "axes")], keepdims=keepdims)
        return self.op(op_type, [x], axes=axes, keepdims=keepdims)

    def unsqueeze(self, x: str, axes: list[int]) -> str:
        return self.op("Unsqueeze", [x, self.const(np.array(axes, np.int64), "axes")])

    def cast(self, x: str, to: int) -> str:
        return self.op("Cast", [x], to=to)


def _to_bf16_bits(value: np.ndarray) -> bytes:
    """float32 -> bfloat16 by round-to-nearest-even, as raw little-endian bytes."""
    bits = np.ascontiguousarray(value, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
