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

from .onnx_ops import GraphBuilder
from .spec import INPUT_NAME, MASK_NAME, ExportSpec

F32 = TensorProto.FLOAT
MATMUL_TYPES = {"fp32": F32, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16, "int8": F32}


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy()


class _BiLMGraph:
    def __init__(self, model: BiLM, spec: ExportSpec) -> None:
        self.model, self.spec, self.cfg = model, spec, model.config
        self.g = GraphBuilder(spec.opset)
        self.mm_type = MATMUL_TYPES[spec.precision]
        self.boundaries = _np(model.encoder.boundary_embeddings())  # (2, P) float64: <S>, </S>

    # ---- helpers --------------------------------------------------------------------------
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

    # ---- char-CNN ---------------------------------------------------------------------------
    def char_cnn(self, ids: str) -> str:
        """Shape: ids (B, T, C) int32 -> (B*T, P) float32; once per distinct token with ``token_dedup``."""
        g, C = self.g, self.spec.max_chars
        flat = g.op("Reshape", [ids, g.const(np.array([-1, C], np.int64), "shape")])  # (N, C)
        if not self.spec.token_dedup:
            return self.token_encoder(flat)
        # ONNX Runtime's Unique has no int32 kernel; ids < 263 are exact in int64.
        distinct, _, inverse, _ = g.op("Unique", [g.cast(flat, TensorProto.INT64)], n_out=4, axis=0, sorted=0)  # (U, C), (N,)
        return g.op("Gather", [self.token_encoder(distinct), inverse], axis=0)  # (N, P)

    def token_encoder(self, flat: str) -> str:
        """Shape: flat (N, C) int32/int64 character ids -> (N, P) float32."""
        g, enc = self.g, self.model.encoder
        if self.spec.token_dedup:  # the ONNX Runtime graph: as the torch encoder computes it
            pooled = self.pooled_windows(self.trim_tail(flat))
        else:  # the TensorRT-parsable graph: fixed-width Conv2D with (1, w) kernels
            pooled = self.pooled_conv(flat)
        pooled = [g.op("Relu" if enc.cfg.activation == "relu" else "Tanh", [y]) for y in pooled]  # (N, n_k) each
        x = g.op("Concat", pooled, axis=1)  # (N, F)
        F = enc.cfg.n_filters
        for k in range(enc.highway.n_layers):
            proj = g.op("Add", [self.matmul(x, self.weight(_np(enc.highway.weight[k]), "hw_w")),
                                g.const(_np(enc.highway.bias[k]).astype(np.float32), "hw_b")])  # (N, 2F)
            t, gate = g.op("Split", [proj, g.const(np.array([F, F], np.int64), "split")], n_out=2, axis=1)
            t, gate = g.op("Relu", [t]), g.op("Sigmoid", [gate])  # (N, F) each
            x = g.op("Add", [x, g.op("Mul", [gate, g.op("Sub", [t, x])])])  # g*t + (1-g)*x
        w = self.weight(_np(enc.proj_weight), "proj_w")
        return g.op("Add", [self.matmul(x, w), g.const(_np(enc.proj_bias).astype(np.float32), "proj_b")])  # (N, P)

    def embed(self, flat: str) -> str:
        """Shape: (N, C') ids -> (N, C', E) character embeddings."""
        table = self.g.const(_np(self.model.encoder.char_embed).astype(np.float32), "char_embed")  # (n_chars, E)
        return self.g.op("Gather", [table, flat])

    def pooled_conv(self, flat: str) -> list[str]:
        """Each width's convolution over all C positions, max-pooled. Shape: (N, C) -> [(N, n_k)]."""
        g = self.g
        emb = g.unsqueeze(g.op("Transpose", [self.embed(flat)], perm=[0, 2, 1]), [2])  # (N, E, 1, C)
        pooled = []
        for conv in self.model.encoder.convs:
            w = g.const(_np(conv.weight)[:, :, None, :].astype(np.float32), "conv_w")  # (n, E, 1, w)
            y = g.op("Conv", [emb, w, g.const(_np(conv.bias).astype(np.float32), "conv_b")])  # (N, n, 1, C-w+1)
            pooled.append(g.reduce("ReduceMax", y, [2, 3]))  # (N, n)
        return pooled

    def trim_tail(self, flat: str) -> str:
        """Drop the columns past every token's content plus the widest filter, as CharEncoder._trim_tail.

        A window wholly inside a token's tail (the trailing run of its last id) has the same value
        wherever it lies and one of each width is kept, so the max-pools are unchanged (exact).
        The kept width depends on the values, so TensorRT could not build it: ONNX Runtime graph only.

        Shape: (N, C) -> (N, C'), C' = min(C, longest content + widest filter).
        """
        g, C = self.g, self.spec.max_chars
        widest = max(w for w, _ in self.cfg.char_cnn.filters)
        last = g.op("Slice", [flat, g.const(np.array([C - 1], np.int64)), g.const(np.array([C], np.int64)),
                              g.const(np.array([1], np.int64))])  # (N, 1)
        varies = g.cast(g.op("Not", [g.op("Equal", [flat, last])]), F32)  # (N, C)
        position = g.const(np.arange(1, C + 1, dtype=np.float32), "position")  # (C,) 1-based
        longest = g.reduce("ReduceMax", g.op("Mul", [varies, position]), [0, 1], keepdims=1)  # (1, 1), in float
        keep = g.op("Min", [g.op("Add", [longest, g.const(np.float32(widest))]), g.const(np.float32(C))])
        keep = g.op("Reshape", [g.cast(keep, TensorProto.INT64), g.const(np.array([1], np.int64))])  # [C']
        return g.op("Slice", [flat, g.const(np.array([0], np.int64)), keep, g.const(np.array([1], np.int64))])

    def pooled_windows(self, flat: str) -> list[str]:
        """Each width's convolution as one MatMul over the unfolded windows (im2col), max-pooled, the
        bias added after the max (the same value); fp32 in the fp16/bf16 graphs, quantized in int8.

        Shape: (N, C') -> [(N, n_k)].
        """
        g, C = self.g, self.spec.max_chars
        emb = self.embed(flat)  # (N, C', E)
        E = self.cfg.char_cnn.embedding_dim
        width = g.op("Shape", [flat], start=1, end=2)  # [C']
        pooled = []
        for (w, n), conv in zip(self.cfg.char_cnn.filters, self.model.encoder.convs):
            starts = np.arange(C - w + 1, dtype=np.int64)[:, None] + np.arange(w, dtype=np.int64)  # (C-w+1, w)
            n_win = g.op("Sub", [width, g.const(np.array([w - 1], np.int64))])  # [C'-w+1]
            idx = g.op("Slice", [g.const(starts, "windows"), g.const(np.array([0], np.int64)), n_win])  # (C'-w+1, w)
            windows = g.op("Reshape", [g.op("Gather", [emb, idx], axis=1),
                                       g.const(np.array([0, 0, w * E], np.int64))])  # (N, C'-w+1, w*E)
            kernel = _np(conv.weight).transpose(2, 1, 0).reshape(w * E, n).astype(np.float32)  # (w*E, n), (w, E) order
            y = g.op("MatMul", [windows, g.const(kernel, "conv_w")])  # (N, C'-w+1, n), fp32 as the Conv path
            bias = g.const(_np(conv.bias).astype(np.float32), "conv_b")  # (n,)
            pooled.append(g.op("Add", [g.reduce("ReduceMax", y, [1]), bias]))  # (N, n)
        return pooled

    # ---- masks, boundaries --------------------------------------------------------------------
    def masks(self, ids: str) -> tuple[str, str]:
        """Token mask and lengths, reduced in float (no int64 reductions).

        Shape: ids (B, T, C) -> mask (B, T) float32, lengths (B,) float32.
        """
        g = self.g
        nonpad = g.cast(g.op("Greater", [ids, g.const(np.array(0, np.int32), "zero")]), F32)  # (B, T, C)
        mask = g.reduce("ReduceMax", nonpad, [2])  # (B, T)
        return mask, g.reduce("ReduceSum", mask, [1])  # (B,)

    def with_boundaries(self, tokens: str, mask: str, lengths: str, shape_bt: str) -> tuple[str, str, str]:
        """<S> first, </S> after each row's last token, as BiLM._with_boundaries.

        Shape: tokens (B*T, P) -> x (B, T+2, P), full mask (B, T+2) float, positions (T+2,) float.
        """
        g, P = self.g, self.cfg.lstm.projection_dim
        bos, eos = self.boundaries.astype(np.float32)  # (P,) each
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

    def reverse_index(self, pos: str, lengths: str, like: str) -> str:
        """Each row reversed within its own length, padding left in place (self-inverse).

        Shape: pos (T2,), lengths (B,) -> (T2, B, P) int64 index for GatherElements on axis 0.
        """
        g = self.g
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
    from .onnx_lstm import lstm_layers  # the Scan part lives beside this file

    model = model.eval()
    with torch.no_grad():
        b = _BiLMGraph(model, spec)
        g = b.g
        mask, lengths = b.masks(INPUT_NAME)
        shape_bt = g.op("Shape", [INPUT_NAME], start=0, end=2)  # [B, T]
        x, full, pos = b.with_boundaries(b.char_cnn(INPUT_NAME), mask, lengths, shape_bt)
        xt = g.op("Transpose", [x], perm=[1, 0, 2])  # (T2, B, P) time-major
        rev = b.reverse_index(pos, lengths, xt)  # (T2, B, P)
        mt = g.unsqueeze(g.op("Transpose", [full], perm=[1, 0]), [2])  # (T2, B, 1)
        layers = [g.op("Concat", [x, x], axis=2)] + lstm_layers(b, xt, rev, mt)  # (L+1) x (B, T2, 2P)
        stacked = g.op("Concat", [g.unsqueeze(h, [1]) for h in layers], axis=1)  # (B, L+1, T2, 2P)
        stacked = g.op("Slice", [stacked, g.const(np.array([1], np.int64)), g.const(np.array([-1], np.int64)),
                                 g.const(np.array([2], np.int64))])  # (B, L+1, T, 2P)
        out = g.op("Mul", [stacked, g.unsqueeze(mask, [1, 3])])  # zero at padding
        if spec.output == "mixed":
            w = g.const(spec.normalized_mix().astype(np.float32).reshape(1, -1, 1, 1), "mix")
            out = g.reduce("ReduceSum", g.op("Mul", [out, w]), [1])  # (B, T, 2P), in fp32
        g.nodes.append(helper.make_node("Identity", [out], [spec.output_name], name="output"))
        g.nodes.append(helper.make_node("Cast", [mask], [MASK_NAME], name="mask_out", to=TensorProto.BOOL))
    return _assemble(g, spec)


def _assemble(g: GraphBuilder, spec: ExportSpec) -> onnx.ModelProto:
    from .onnx_ops import DTYPE_NAMES

    def info(t):  # type: ignore[no-untyped-def]
        return helper.make_tensor_value_info(t.name, DTYPE_NAMES[t.dtype], list(t.dims))

    graph = helper.make_graph(g.nodes, "elmo_bilm", [info(t) for t in spec.inputs], [info(t) for t in spec.outputs],
                              g.initializers)
    opsets = [helper.make_opsetid("", spec.opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="elmo-pipeline",
                              ir_version=helper.find_min_ir_version_for(opsets))
    model.doc_string = f"ELMo biLM, output={spec.output}, precision={spec.precision}"
    return model
