"""A small ONNX graph-building helper and the list of ops TensorRT's ONNX parser supports."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .errors import UnsupportedOpError

# Ops marked supported ("Y") in onnx-tensorrt's docs/operators.md for TensorRT 10.x
# (github.com/onnx/onnx-tensorrt, docs/operators.md: "TensorRT 10.15 supports operators in the
# inclusive range of opset 9 to opset 24"). Only the subset a biLM could plausibly use is listed;
# everything this project's graphs emit must be in it. Sequence*, Unique, NonZero-free.
TENSORRT_SUPPORTED_OPS = frozenset({
    "Abs", "Add", "And", "ArgMax", "ArgMin", "Cast", "CastLike", "Ceil", "Clip", "Concat", "Constant",
    "ConstantOfShape", "Conv", "CumSum", "Div", "Einsum", "Equal", "Erf", "Exp", "Expand", "Flatten", "Floor",
    "Gather", "GatherElements", "GatherND", "Gemm", "Greater", "GreaterOrEqual", "Identity", "If", "Less",
    "LessOrEqual", "Log", "Loop", "LSTM", "MatMul", "Max", "MaxPool", "Min", "Mod", "Mul", "Neg", "Not", "Or",
    "Pad", "Pow", "Range", "Reciprocal", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum", "Relu", "Reshape",
    "ReverseSequence", "Scan", "Shape", "Sigmoid", "Sign", "Size", "Slice", "Softmax", "Split", "Sqrt",
    "Squeeze", "Sub", "Sum", "Tanh", "Tile", "Transpose", "Unsqueeze", "Where", "Xor",
})
# Marked "N" there; a graph with any of these cannot be parsed (kept to make the test explicit).
TENSORRT_UNSUPPORTED_OPS = frozenset({
    "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength",
    "SequenceMap", "SplitToSequence", "ConcatFromSequence", "Unique", "DynamicQuantizeLinear", "MatMulInteger",
    "ConvInteger", "Optional", "OptionalGetElement", "OptionalHasElement",
})

NP_TO_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
              np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64,
              np.dtype(bool): TensorProto.BOOL}
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
        arr = np.asarray(value, dtype=dtype)
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def typed_const(self, value: np.ndarray, onnx_type: int, base: str) -> str:
        """An initializer of any ONNX float type (bfloat16 too, which numpy lacks)."""
        name = self.fresh(base)
        if onnx_type == TensorProto.BFLOAT16:
            tensor = helper.make_tensor(name, onnx_type, value.shape, _to_bf16_bits(value), raw=True)
        elif onnx_type == TensorProto.FLOAT16:
            tensor = numpy_helper.from_array(np.asarray(value, np.float16), name)
        else:
            tensor = numpy_helper.from_array(np.asarray(value, np.float32), name)
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
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded.tobytes()


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of a graph and, recursively, of its subgraphs (Scan/Loop/If bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from iter_nodes(g)


def op_types(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in iter_nodes(model.graph)}


def check_tensorrt_ops(model: onnx.ModelProto) -> None:
    """Raise UnsupportedOpError naming every op TensorRT's ONNX parser cannot import."""
    bad = sorted(op for op in op_types(model) if op not in TENSORRT_SUPPORTED_OPS)
    if bad:
        raise UnsupportedOpError(f"ops not supported by TensorRT's ONNX parser: {bad}")
