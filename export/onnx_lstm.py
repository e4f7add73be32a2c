"""The biLSTM stack as one ONNX Scan over time per layer (both directions in one body).

Each direction's input product is one 2D MatMul with its bias over all steps (ONNX Runtime fuses
it into a Gemm; per-gate products measured slower). Padded steps emit zeros but need not hold the
state: a row's padding only follows its valid steps (the backward direction reads each row
reversed within its length), the Scan's final states are unused, and steps on the zero padding
inputs keep the state finite (|c| grows by less than 1 a step, h is bounded), so no padded step
reaches a valid output.

Step 0 is the same for every row (each direction starts at a boundary token from the zero state:
<S> forward, </S> backward), so its states and outputs are computed at export, in float64, and the
Scan starts at step 1 from them (the torch backend computes that step once per batch).
"""
from __future__ import annotations

import numpy as np
import torch
from onnx import helper

from elmo_core.lstm_cell import lstm_step

from .onnx_builder import GraphBuilder
from .onnx_context import F32, GraphContext, np64

DIRECTIONS = ("fwd", "bwd")


def lstm_step_graph(b: GraphContext, body: GraphBuilder, h: str, c: str, gx: str, m: str,
                    w_state: str, w_proj: str) -> tuple[str, str, str]:
    """One LSTM step of one direction as ONNX ops: ``elmo_core.lstm_cell.lstm_step`` (the reference)
    plus the recurrent product; outputs at padding (m = 0) are zero.

    Shape: h (B, P), c (B, C), gx (B, 4C), m (B, 1) -> h, c, out (B, P).
    """
    cfg, C = b.cfg.lstm, b.cfg.lstm.dim
    gates = body.op("Add", [gx, b.matmul(h, w_state, body)])  # (B, 4C), TF's gate order i, j, f, o
    i, j, f, o = body.op("Split", [gates, body.const(np.array([C] * 4, np.int64), "split")], n_out=4, axis=1)
    i, j, f, o = body.op("Sigmoid", [i]), body.op("Tanh", [j]), body.op("Sigmoid", [f]), body.op("Sigmoid", [o])
    c_new = body.op("Add", [body.op("Mul", [f, c]), body.op("Mul", [i, j])])  # (B, C)
    if cfg.cell_clip is not None:
        c_new = body.op("Clip", [c_new, body.const(np.float32(-cfg.cell_clip)), body.const(np.float32(cfg.cell_clip))])
    h_new = b.matmul(body.op("Mul", [o, body.op("Tanh", [c_new])]), w_proj, body)  # (B, P)
    if cfg.proj_clip is not None:
        h_new = body.op("Clip", [h_new, body.const(np.float32(-cfg.proj_clip)), body.const(np.float32(cfg.proj_clip))])
    return h_new, c_new, body.op("Mul", [h_new, m])  # out (B, P) zero at padding


def _scan_body(b: GraphContext, layer: int):  # type: ignore[no-untyped-def]
    """The Scan body: states h/c of both directions; scan inputs gx of each direction, m.

    The recurrent weights are the body's own initializers (not outer-scope values), so that
    quantizers and TensorRT see them as constants of the MatMuls that use them.
    """
    P, C = b.cfg.lstm.projection_dim, b.cfg.lstm.dim
    lstm = b.model.lstm
    body = GraphBuilder(b.spec.opset, prefix=f"l{layer}_")
    state_in, scan_in, states, outs = [], [], [], []
    for name in DIRECTIONS:
        state_in += [helper.make_tensor_value_info(f"l{layer}_h_{name}_in", F32, ["batch", P]),
                     helper.make_tensor_value_info(f"l{layer}_c_{name}_in", F32, ["batch", C])]
        scan_in.append(helper.make_tensor_value_info(f"l{layer}_gx_{name}_t", F32, ["batch", 4 * C]))
    scan_in.append(helper.make_tensor_value_info(f"l{layer}_m_t", F32, ["batch", 1]))
    for d, name in enumerate(DIRECTIONS):
        w_state = b.weight(np64(lstm.w_state[layer, d]), f"w_state_{d}", body)  # (P, 4C)
        w_proj = b.weight(np64(lstm.w_proj[layer, d]), f"w_proj_{d}", body)  # (C, P)
        h, c, out = lstm_step_graph(b, body, f"l{layer}_h_{name}_in", f"l{layer}_c_{name}_in", f"l{layer}_gx_{name}_t",
                          f"l{layer}_m_t", w_state, w_proj)
        states += [h, c]
        outs.append(out)
    out_names = []
    for k, (src, dims) in enumerate(zip(states + outs, [P, C, P, C, P, P])):
        name = f"l{layer}_body_out{k}"
        body.rename(src, name)  # the producer writes the body output itself: no Identity copy
        out_names.append(helper.make_tensor_value_info(name, F32, ["batch", dims]))
    return helper.make_graph(body.nodes, f"lstm_layer{layer}_step", state_in + scan_in, out_names, body.initializers)


def _input_product(b: GraphContext, x_run: str, layer: int, d: int, shape_tbc: str) -> str:
    """The input product and bias of all the Scan's steps, as one 2D MatMul + Add (a Gemm in ONNX Runtime).

    Shape: x_run (S, B, P) -> (S, B, 4C).
    """
    g, lstm = b.g, b.model.lstm
    bias = np64(lstm.bias[layer, d] + lstm.forget_offset).astype(np.float32)  # (4C,): TF's +1 forget bias folded in
    w_in = b.weight(np64(lstm.w_input[layer, d]), f"w_input_{layer}_{d}")  # (P, 4C)
    x2 = g.op("Reshape", [x_run, g.const(np.array([-1, b.cfg.lstm.projection_dim], np.int64))])  # (S*B, P)
    return g.op("Reshape", [g.op("Add", [b.matmul(x2, w_in), g.const(bias, "lstm_b")]), shape_tbc])


def _first_steps(b: GraphContext) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer, the states after step 0 of both directions (shared by all rows), in float64.

    Shape: -> L x (h (2, 1, P), c (2, 1, C)); h is also the step's output.
    """
    lstm, cfg = b.model.lstm, b.cfg.lstm
    with torch.no_grad():
        x = torch.from_numpy(b.boundaries)[:, None, :]  # (2, 1, P) float64: <S> fwd, </S> bwd
        steps = []
        for layer in range(cfg.n_layers):
            bias = (lstm.bias[layer] + lstm.forget_offset).double()[:, None, :]  # (2, 1, 4C)
            gates = torch.baddbmm(bias, x, lstm.w_input[layer].double())  # (2, 1, 4C); zero state: no W_state term
            h, c = lstm_step(gates, torch.zeros(2, 1, cfg.dim, dtype=torch.float64), lstm.w_proj[layer].double(),
                             cfg.cell_clip, cfg.proj_clip)  # (2, 1, P), (2, 1, C)
            steps.append((h.numpy(), c.numpy()))
            x = h + x if layer > 0 and cfg.use_skip_connections else h  # (2, 1, P): the next layer's input
    return steps


def _over_batch(g: GraphBuilder, value: np.ndarray, batch: str, base: str) -> str:
    """A constant with a batch axis of 1 just before its last axis, expanded to the batch.

    Shape: (..., 1, n) -> (..., B, n).
    """
    shape = g.op("Concat", [g.const(np.array(value.shape[:-2], np.int64)), batch,
                            g.const(np.array(value.shape[-1:], np.int64))], axis=0)
    return g.op("Expand", [g.const(value.astype(np.float32), base), shape])


def lstm_layers(b: GraphContext, xt: str, rev: str, mt: str) -> list[str]:
    """All LSTM layers. Shape: xt (T2, B, P), rev (T2, B, P) int64, mt (T2, B, 1) -> L x (B, T2, 2P)."""
    g, cfg = b.g, b.cfg.lstm
    P, C = cfg.projection_dim, cfg.dim
    batch = g.op("Shape", [xt], start=1, end=2)  # [B]
    xs = [xt, g.op("GatherElements", [xt, rev], axis=0)]  # fwd natural, bwd reversed within length
    # Step 0 is a constant (_first_steps). Each direction's last step reads the other boundary
    # token of the longest row; its output is sliced away and nothing reads its state, so the Scan
    # runs steps 1 .. T2-2 and a zero step is appended (the torch backend skips that step too).
    run = (g.const(np.array([1], np.int64)), g.const(np.array([-1], np.int64)))
    zero_step = _over_batch(g, np.zeros((1, 1, P)), batch, "zero_step")  # (1, B, P)
    m_run = g.op("Slice", [mt, *run])  # (T2-2, B, 1)
    shape_tbc = g.op("Concat", [g.const(np.array([-1], np.int64)), batch, g.const(np.array([4 * C], np.int64))], axis=0)
    outputs = []
    for layer, (h0, c0) in enumerate(_first_steps(b)):
        gx = [_input_product(b, g.op("Slice", [xs[d], *run]), layer, d, shape_tbc) for d in range(2)]
        states = [_over_batch(g, v[d], batch, name) for d in range(2) for v, name in ((h0, "h1"), (c0, "c1"))]
        res = g.op("Scan", [*states, *gx, m_run], n_out=6, num_scan_inputs=len(gx) + 1, body=_scan_body(b, layer))
        out = [g.op("Concat", [_over_batch(g, h0[d:d + 1], batch, "out0"), o, zero_step], axis=0)
               for d, o in enumerate(res[4:])]  # (T2, B, P) each, bwd in reversed order
        if layer > 0 and cfg.use_skip_connections:
            out = [g.op("Add", [o, x]) for o, x in zip(out, xs)]
        xs = out
        both = g.op("Concat", [out[0], g.op("GatherElements", [out[1], rev], axis=0)], axis=2)  # (T2, B, 2P)
        outputs.append(g.op("Transpose", [both], perm=[1, 0, 2]))  # (B, T2, 2P)
    return outputs
