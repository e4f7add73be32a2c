"""The stateless biLM as an ONNX graph built from its parameters with ``onnx.helper``.

Why not ``torch.onnx.export``: the torch LSTM loops in Python over a length-dependent active set,
which tracing unrolls to the example's length; scripting it into a Loop is brittle across torch
versions. Building the graph here keeps every op under control (TensorRT's parser list, no int64
reductions, no Sequence ops) and reads names, dtypes and the opset from the ``ExportSpec``.

Layout: the char-CNN runs on all B*T tokens (Gather, Conv, ReduceMax, highway, projection);
<S>/</S> are added around each row inside the graph as ``BiLM.run`` does. Each LSTM layer is one
input-projection MatMul per direction over all timesteps, then one Scan over time whose body does
one step of both directions; padded steps keep the state and emit zeros. The backward direction
reads each row reversed within its length (GatherElements with a self-inverse index).
"""
from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from elmo_core import BiLM
from formats.export_spec import INPUT_NAME, MASK_NAME, ExportSpec

from .onnx_builder import DTYPE_NAMES, GraphBuilder
from .onnx_char_cnn import char_cnn
from .onnx_context import F32, GraphContext
from .onnx_lstm import lstm_layers


def masks(b: GraphContext, ids: str) -> tuple[str, str]:
    """Token mask and lengths, reduced in float (no int64 reductions).

    Shape: ids (B, T, C) -> mask (B, T) float32, lengths (B,) float32.
    """
    g = b.g
    nonpad = g.cast(g.op("Greater", [ids, g.const(np.array(0, np.int32), "zero")]), F32)  # (B, T, C)
    mask = g.reduce("ReduceMax", nonpad, [2])  # (B, T)
    return mask, g.reduce("ReduceSum", mask, [1])  # (B,)



def with_boundaries(b: GraphContext, tokens: str, mask: str, lengths: str, shape_bt: str) -> tuple[str, str, str]:
    """<S> first, </S> after each row's last token, as BiLM._with_boundaries.

    Shape: tokens (B*T, P) -> x (B, T+2, P), full mask (B, T+2) float, positions (T+2,) float.
    """
    g, P = b.g, b.cfg.lstm.projection_dim
    bos, eos = b.boundaries.astype(np.float32)  # (P,) each
    tokens = g.op("Reshape", [tokens, g.op("Concat", [shape_bt, g.const(np.array([P], np.int64))], axis=0)])
    tokens = g.op("Mul", [tokens, g.unsqueeze(mask, [2])])  # (B, T, P) zero at padding
    b1p = g.op("Concat", [g.op("Slice", [shape_bt, g.const(np.array([0], np.int64)), g.const(np.array([1], np.int64))]),
                          g.const(np.array([1, P], np.int64))], axis=0)  # [B, 1, P]
    first = g.op("Expand", [g.const(bos.reshape(1, 1, P), "bos"), b1p])  # (B, 1, P)
    last = g.op("Expand", [g.const(np.zeros((1, 1, P), np.float32), "zeros"), b1p])  # (B, 1, P)
    x = g.op("Concat", [first, tokens, last], axis=1)  # (B, T+2, P)
    t2 = g.op("Squeeze", [g.op("Shape", [x], start=1, end=2), g.const(np.array([0], np.int64))])  # T+2
    pos = g.cast(g.op("Range", [g.const(np.array(0, np.int64)), t2, g.const(np.array(1, np.int64))]), F32)  # (T+2,)
    len_col = g.unsqueeze(lengths, [1])  # (B, 1)
    is_eos = g.cast(g.op("Equal", [g.unsqueeze(pos, [0]), g.op("Add", [len_col, g.const(np.float32(1))])]), F32)
    x = g.op("Add", [x, g.op("Mul", [g.unsqueeze(is_eos, [2]), g.const(eos.reshape(1, 1, P), "eos")])])
    full = g.cast(g.op("Less", [g.unsqueeze(pos, [0]), g.op("Add", [len_col, g.const(np.float32(2))])]), F32)
    return x, full, pos  # (B, T+2, P), (B, T+2), (T+2,)



def reverse_index(b: GraphContext, pos: str, lengths: str, like: str) -> str:
    """Each row reversed within its own length, padding left in place (self-inverse).

    Shape: pos (T2,), lengths (B,) -> (T2, B, P) int64 index for GatherElements on axis 0.
    """
    g = b.g
    len2 = g.unsqueeze(g.op("Add", [lengths, g.const(np.float32(2))]), [0])  # (1, B)
    t = g.unsqueeze(pos, [1])  # (T2, 1)
    rev = g.op("Sub", [g.op("Sub", [len2, g.const(np.float32(1))]), t])  # (T2, B)
    idx = g.op("Where", [g.op("Less", [t, len2]), rev, t])  # (T2, B)
    idx = g.cast(g.unsqueeze(idx, [2]), TensorProto.INT64)  # (T2, B, 1)
    return g.op("Expand", [idx, g.op("Shape", [like])])  # (T2, B, P)


def build_onnx(model: BiLM, spec: ExportSpec) -> onnx.ModelProto:
    """The biLM as an ONNX model following ``spec`` (fp32/fp16/bf16 matmuls; int8 is a later pass).

    Shape: char_ids (B, T, C) int32 -> layers (B, L+1, T, 2P) or mixed (B, T, 2P), mask (B, T) bool.
    """
    model = model.eval()
    with torch.no_grad():
        b = GraphContext(model, spec)
        g = b.g
        mask, lengths = masks(b, INPUT_NAME)
        shape_bt = g.op("Shape", [INPUT_NAME], start=0, end=2)  # [B, T]
        x, full, pos = with_boundaries(b, char_cnn(b, INPUT_NAME), mask, lengths, shape_bt)
        xt = g.op("Transpose", [x], perm=[1, 0, 2])  # (T2, B, P) time-major
        rev = reverse_index(b, pos, lengths, xt)  # (T2, B, P)
        mt = g.unsqueeze(g.op("Transpose", [full], perm=[1, 0]), [2])  # (T2, B, 1)
        layers = [g.op("Concat", [x, x], axis=2)] + lstm_layers(b, xt, rev, mt)  # (L+1) x (B, T2, 2P)
        stacked = g.op("Concat", [g.unsqueeze(h, [1]) for h in layers], axis=1)  # (B, L+1, T2, 2P)
        stacked = g.op("Slice", [stacked, g.const(np.array([1], np.int64)), g.const(np.array([-1], np.int64)),
                                 g.const(np.array([2], np.int64))])  # (B, L+1, T, 2P)
        out = g.op("Mul", [stacked, g.unsqueeze(mask, [1, 3])])  # zero at padding
        if spec.mode.mixes:
            w = g.const(spec.normalized_mix().astype(np.float32).reshape(1, -1, 1, 1), "mix")
            out = g.reduce("ReduceSum", g.op("Mul", [out, w]), [1])  # (B, T, 2P), in fp32
        g.nodes.append(helper.make_node("Identity", [out], [spec.output_name], name="output"))
        g.nodes.append(helper.make_node("Cast", [mask], [MASK_NAME], name="mask_out", to=TensorProto.BOOL))
    return _assemble(g, spec)


def _assemble(g: GraphBuilder, spec: ExportSpec) -> onnx.ModelProto:
    def info(t):  # type: ignore[no-untyped-def]
        return helper.make_tensor_value_info(t.name, DTYPE_NAMES[t.dtype], list(t.dims))

    graph = helper.make_graph(g.nodes, "elmo_bilm", [info(t) for t in spec.inputs], [info(t) for t in spec.outputs],
                              g.initializers)
    opsets = [helper.make_opsetid("", spec.opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="elmo-pipeline",
                              ir_version=helper.find_min_ir_version_for(opsets))
    model.doc_string = f"ELMo biLM, output={spec.vectors.output}, precision={spec.precision}"
    return model
