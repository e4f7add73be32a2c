"""The ONNX ops TensorRT's ONNX parser takes, and the check that a graph uses only those."""
from __future__ import annotations

from typing import Iterator

import onnx

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


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """A node's own subgraphs (a Scan or Loop body, an If's branches)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of a graph and, recursively, of its subgraphs (Scan/Loop/If bodies)."""
    for node in graph.node:
        yield node
        for g in subgraphs(node):
            yield from iter_nodes(g)


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """A graph and, recursively, every subgraph in it."""
    yield graph
    for node in graph.node:
        for g in subgraphs(node):
            yield from iter_graphs(g)


def op_types(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in iter_nodes(model.graph)}


def check_tensorrt_ops(model: onnx.ModelProto) -> None:
    """Raise UnsupportedOpError naming every op TensorRT's ONNX parser cannot import."""
    bad = sorted(op for op in op_types(model) if op not in TENSORRT_SUPPORTED_OPS)
    if bad:
        raise UnsupportedOpError(f"ops not supported by TensorRT's ONNX parser: {bad}")
