"""The biLSTM stack as one ONNX Scan over time per layer (both directions in one body)."""
from __future__ import annotations

import numpy as np
from onnx import helper

from .onnx_graph import F32, _BiLMGraph, _np
from .onnx_ops import GraphBuilder

DIRECTIONS = ("fwd", "bwd")


def _step(b: _BiLMGraph, body: GraphBuilder, layer: int, d: int, h: str, c: str, gx: str, m: str,
          keep: str, w_state: str, w_proj: str) -> tuple[str, str, str]:
    """One LSTM step of one direction; padded rows (m = 0) keep their state and emit zeros.

    Shape: h (B, P), c (B, C), gx (B, 4C), m (B, 1) -> h, c, out (B, P).
    """
    cfg = b.cfg.lstm
    C = cfg.dim
    gates = body.op("Add", [gx, b.matmul(h, w_state, body)])  # (B, 4C), forget offset in the bias
    i, j, f, o = body.op("Split", [gates, body.const(np.array([C] * 4, np.int64), "split")], n_out=4, axis=1)
    c_new = body.op("Add", [body.op("Mul", [body.op("Sigmoid", [f]), c]),
                            body.op("Mul", [body.op("Sigmoid", [i]), body.op("Tanh", [j])])])  # (B, C)
    if cfg.cell_clip is not None:
        c_new = body.op("Clip", [c_new, body.const(np.float32(-cfg.cell_clip)), body.const(np.float32(cfg.cell_clip))])
    h_new = b.matmul(body.op("Mul", [body.op("Sigmoid", [o]), body.op("Tanh", [c_new])]), w_proj, body)  # (B, P)
    if cfg.proj_clip is not None:
        h_new = body.op("Clip", [h_new, body.const(np.float32(-cfg.proj_clip)), body.const(np.float32(cfg.proj_clip))])
    out = body.op("Mul", [h_new, m])  # (B, P), zero at padding
    # m in {0, 1}: x*1 + y*0 is exactly x, so finished rows keep their state bit for bit.
    h_next = body.op("Add", [out, body.op("Mul", [h, keep])])  # (B, P)
    c_next = body.op("Add", [body.op("Mul", [c_new, m]), body.op("Mul", [c, keep])])  # (B, C)
    return h_next, c_next, out


def _scan_body(b: _BiLMGraph, layer: int):  # type: ignore[no-untyped-def]
    """The Scan body: states h/c of both directions, scan inputs gx_fwd, gx_bwd, m at step t.

    The recurrent weights are the body's own initializers (not outer-scope values), so that
    quantizers and TensorRT see them as constants of the MatMuls that use them.
    """
    P, C = b.cfg.lstm.projection_dim, b.cfg.lstm.dim
    lstm = b.model.lstm
    body = GraphBuilder(b.spec.opset, prefix=f"l{layer}_")
    weights = [(b.weight(_np(lstm.w_state[layer, d]), f"w_state_{d}", body),
                b.weight(_np(lstm.w_proj[layer, d]), f"w_proj_{d}", body)) for d in range(2)]
    state_in, scan_in = [], []
    for name in DIRECTIONS:
        state_in += [helper.make_tensor_value_info(f"l{layer}_h_{name}_in", F32, ["batch", P]),
                     helper.make_tensor_value_info(f"l{layer}_c_{name}_in", F32, ["batch", C])]
        scan_in.append(helper.make_tensor_value_info(f"l{layer}_gx_{name}_t", F32, ["batch", 4 * C]))
    scan_in.append(helper.make_tensor_value_info(f"l{layer}_m_t", F32, ["batch", 1]))
    m = f"l{layer}_m_t"
    keep = body.op("Sub", [body.const(np.float32(1)), m])  # (B, 1)
    states, outs = [], []
    for d, name in enumerate(DIRECTIONS):
        h, c, out = _step(b, body, layer, d, f"l{layer}_h_{name}_in", f"l{layer}_c_{name}_in",
                          f"l{layer}_gx_{name}_t", m, keep, *weights[d])
        states += [h, c]
        outs.append(out)
    out_names = []
    for k, (src, dims) in enumerate(zip(states + outs, [P, C, P, C, P, P])):
        name = f"l{layer}_body_out{k}"
        body.nodes.append(helper.make_node("Identity", [src], [name], name=f"l{layer}_body_id{k}"))
        out_names.append(helper.make_tensor_value_info(name, F32, ["batch", dims]))
    return helper.make_graph(body.nodes, f"lstm_layer{layer}_step", state_in + scan_in, out_names, body.initializers)


def lstm_layers(b: _BiLMGraph, xt: str, rev: str, mt: str) -> list[str]:
    """All LSTM layers. Shape: xt (T2, B, P), rev (T2, B, P) int64, mt (T2, B, 1) -> L x (B, T2, 2P)."""
    g, lstm, cfg = b.g, b.model.lstm, b.cfg.lstm
    P, C = cfg.projection_dim, cfg.dim
    batch = g.op("Shape", [xt], start=1, end=2)  # [B]
    zeros_h = g.op("Expand", [g.const(np.zeros((1, P), np.float32), "h0"), g.op("Concat", [batch, g.const(np.array([P], np.int64))], axis=0)])
    zeros_c = g.op("Expand", [g.const(np.zeros((1, C), np.float32), "c0"), g.op("Concat", [batch, g.const(np.array([C], np.int64))], axis=0)])
    xs = [xt, g.op("GatherElements", [xt, rev], axis=0)]  # fwd natural, bwd reversed within length
    # Each direction's last step reads the other boundary token of the longest row; its output is
    # sliced away and nothing reads its state, so the Scan runs T2-1 steps and a zero step is
    # appended (as the torch backend skips that step).
    first_steps = (g.const(np.array([0], np.int64)), g.const(np.array([-1], np.int64)))
    zero_step = g.op("Expand", [g.const(np.zeros((1, 1, P), np.float32), "zero_step"),
                                g.op("Concat", [g.const(np.array([1], np.int64)), batch,
                                                g.const(np.array([P], np.int64))], axis=0)])  # (1, B, P)
    m_run = g.op("Slice", [mt, *first_steps])  # (T2-1, B, 1)
    outputs = []
    bias = _np(lstm.bias + lstm.forget_offset)  # (L, 2, 4C): TF's +1 forget bias folded in
    for layer in range(cfg.n_layers):
        gx = []
        for d in range(2):
            w_in = b.weight(_np(lstm.w_input[layer, d]), f"w_input_{layer}_{d}")  # (P, 4C)
            x_run = g.op("Slice", [xs[d], *first_steps])  # (T2-1, B, P)
            gx.append(g.op("Add", [b.matmul(x_run, w_in), g.const(bias[layer, d].astype(np.float32), "lstm_b")]))  # (T2-1, B, 4C)
        body = _scan_body(b, layer)
        res = g.op("Scan", [zeros_h, zeros_c, zeros_h, zeros_c, gx[0], gx[1], m_run], n_out=6, num_scan_inputs=3,
                   body=body)
        out = [g.op("Concat", [o, zero_step], axis=0) for o in res[4:]]  # (T2, B, P) each, bwd in reversed order
        if layer > 0 and cfg.use_skip_connections:
            out = [g.op("Add", [o, x]) for o, x in zip(out, xs)]
        xs = out
        both = g.op("Concat", [out[0], g.op("GatherElements", [out[1], rev], axis=0)], axis=2)  # (T2, B, 2P)
        outputs.append(g.op("Transpose", [both], perm=[1, 0, 2]))  # (B, T2, 2P)
    return outputs



