"""The char-CNN token encoder as ONNX: character embedding, convolutions, max-pool, highway,
projection (the torch reference is ``elmo_core.char_encoder.CharEncoder``).

Two forms of the convolutions: fixed-width Conv2D over all C positions (TensorRT-parsable), or,
with the spec's ``token_dedup`` (ONNX Runtime only), once per distinct token of the batch, the
characters trimmed past every token's content and each convolution one MatMul over the
unfolded windows, as the torch encoder computes them.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .onnx_context import F32, GraphContext, np64


def char_cnn(b: GraphContext, ids: str) -> str:
    """Shape: ids (B, T, W) int32 -> (B*T, P) float32; once per distinct token with ``token_dedup``."""
    g, W = b.g, b.spec.max_chars
    flat = g.op("Reshape", [ids, g.const(np.array([-1, W], np.int64), "shape")])  # (N, W)
    if not b.spec.token_dedup:
        return token_encoder(b, flat)
    # ONNX Runtime's Unique has no int32 kernel; int32 ids are exact in int64.
    distinct, _, inverse, _ = g.op("Unique", [g.cast(flat, TensorProto.INT64)], n_out=4, axis=0, sorted=0)  # (U, W), (N,)
    return g.op("Gather", [token_encoder(b, distinct), inverse], axis=0)  # (N, P)



def token_encoder(b: GraphContext, flat: str) -> str:
    """Shape: flat (N, W) int32/int64 token ids -> (N, P) float32."""
    g, enc = b.g, b.model.encoder
    words = None
    if enc.word_embed is not None:  # the last column is the word id (dictionary models)
        C = b.cfg.char_cnn.max_characters_per_token
        words = g.op("Gather", [g.const(np64(enc.word_embed).astype(np.float32), "word_embed"),
                                g.op("Squeeze", [_columns(b, flat, C, C + 1), g.const(np.array([1], np.int64))])])  # (N, Dw)
        flat = _columns(b, flat, 0, C)  # (N, C)
    if b.spec.token_dedup:  # the ONNX Runtime graph: as the torch encoder computes it
        pooled = pooled_windows(b, trim_tail(b, flat))
    else:  # the TensorRT-parsable graph: fixed-width Conv2D with (1, w) kernels
        pooled = pooled_conv(b, flat)
    pooled = [g.op("Relu" if enc.cfg.activation == "relu" else "Tanh", [y]) for y in pooled]  # (N, n_k) each
    x = g.op("Concat", pooled, axis=1)  # (N, F)
    F = enc.cfg.n_filters
    for k in range(enc.highway.n_layers):
        proj = g.op("Add", [b.matmul(x, b.weight(np64(enc.highway.weight[k]), "hw_w")),
                            g.const(np64(enc.highway.bias[k]).astype(np.float32), "hw_b")])  # (N, 2F)
        t, gate = g.op("Split", [proj, g.const(np.array([F, F], np.int64), "split")], n_out=2, axis=1)
        t, gate = g.op("Relu", [t]), g.op("Sigmoid", [gate])  # (N, F) each
        x = g.op("Add", [x, g.op("Mul", [gate, g.op("Sub", [t, x])])])  # g*t + (1-g)*x
    if words is not None:
        x = g.op("Concat", [words, x], axis=1)  # (N, Dw+F): the word vector first, as CharEncoder
    w = b.weight(np64(enc.proj_weight), "proj_w")
    return g.op("Add", [b.matmul(x, w), g.const(np64(enc.proj_bias).astype(np.float32), "proj_b")])  # (N, P)



def _columns(b: GraphContext, flat: str, start: int, end: int) -> str:
    """Shape: (N, W) -> (N, end - start)."""
    g = b.g
    return g.op("Slice", [flat, g.const(np.array([start], np.int64)), g.const(np.array([end], np.int64)),
                          g.const(np.array([1], np.int64))])


def embed(b: GraphContext, flat: str) -> str:
    """Shape: (N, C') ids -> (N, C', E) character embeddings."""
    table = b.g.const(np64(b.model.encoder.char_embed).astype(np.float32), "char_embed")  # (n_chars, E)
    return b.g.op("Gather", [table, flat])



def pooled_conv(b: GraphContext, flat: str) -> list[str]:
    """Each width's convolution over all C positions, max-pooled. Shape: (N, C) -> [(N, n_k)]."""
    g = b.g
    emb = g.unsqueeze(g.op("Transpose", [embed(b, flat)], perm=[0, 2, 1]), [2])  # (N, E, 1, C)
    pooled = []
    for conv in b.model.encoder.convs:
        w = g.const(np64(conv.weight)[:, :, None, :].astype(np.float32), "conv_w")  # (n, E, 1, w)
        y = g.op("Conv", [emb, w, g.const(np64(conv.bias).astype(np.float32), "conv_b")])  # (N, n, 1, C-w+1)
        pooled.append(g.reduce("ReduceMax", y, [2, 3]))  # (N, n)
    return pooled



def trim_tail(b: GraphContext, flat: str) -> str:
    """Drop the columns past every token's content plus the widest filter, as CharEncoder._trim_tail.

    A window wholly inside a token's tail (the trailing run of its last id) has the same value
    wherever it lies and one of each width is kept, so the max-pools are unchanged (exact).
    The kept width depends on the values, so TensorRT could not build it: ONNX Runtime graph only.

    Shape: (N, C) -> (N, C'), C' = min(C, longest content + widest filter).
    """
    g, C = b.g, b.cfg.char_cnn.max_characters_per_token
    widest = max(w for w, _ in b.cfg.char_cnn.filters)
    last = _columns(b, flat, C - 1, C)  # (N, 1)
    varies = g.cast(g.op("Not", [g.op("Equal", [flat, last])]), F32)  # (N, C)
    position = g.const(np.arange(1, C + 1, dtype=np.float32), "position")  # (C,) 1-based
    longest = g.reduce("ReduceMax", g.op("Mul", [varies, position]), [0, 1], keepdims=1)  # (1, 1), in float
    keep = g.op("Min", [g.op("Add", [longest, g.const(np.float32(widest))]), g.const(np.float32(C))])
    keep = g.op("Reshape", [g.cast(keep, TensorProto.INT64), g.const(np.array([1], np.int64))])  # [C']
    return g.op("Slice", [flat, g.const(np.array([0], np.int64)), keep, g.const(np.array([1], np.int64))])



def pooled_windows(b: GraphContext, flat: str) -> list[str]:
    """Each width's convolution as one MatMul over the unfolded windows (im2col), max-pooled, the
    bias added after the max (the same value); fp32 in the fp16/bf16 graphs, quantized in int8.

    Shape: (N, C') -> [(N, n_k)].
    """
    g, C = b.g, b.cfg.char_cnn.max_characters_per_token
    emb = embed(b, flat)  # (N, C', E)
    E = b.cfg.char_cnn.embedding_dim
    width = g.op("Shape", [flat], start=1, end=2)  # [C']
    pooled = []
    for (w, n), conv in zip(b.cfg.char_cnn.filters, b.model.encoder.convs):
        starts = np.arange(C - w + 1, dtype=np.int64)[:, None] + np.arange(w, dtype=np.int64)  # (C-w+1, w)
        n_win = g.op("Sub", [width, g.const(np.array([w - 1], np.int64))])  # [C'-w+1]
        idx = g.op("Slice", [g.const(starts, "windows"), g.const(np.array([0], np.int64)), n_win])  # (C'-w+1, w)
        windows = g.op("Reshape", [g.op("Gather", [emb, idx], axis=1),
                                   g.const(np.array([0, 0, w * E], np.int64))])  # (N, C'-w+1, w*E)
        kernel = np64(conv.weight).transpose(2, 1, 0).reshape(w * E, n).astype(np.float32)  # (w*E, n), (w, E) order
        y = g.op("MatMul", [windows, g.const(kernel, "conv_w")])  # (N, C'-w+1, n), fp32 as the Conv path
        bias = g.const(np64(conv.bias).astype(np.float32), "conv_b")  # (n,)
        pooled.append(g.op("Add", [g.reduce("ReduceMax", y, [1]), bias]))  # (N, n)
    return pooled
