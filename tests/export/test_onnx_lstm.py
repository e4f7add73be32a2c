"""The ONNX LSTM step (``export.onnx_lstm.lstm_step_graph``, the Scan body's cell) against the
reference ``elmo_core.lstm_cell.lstm_step``, on ONNX Runtime."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from elmo_core import BiLM, ElmoConfig
from elmo_core.lstm_cell import lstm_step
from export.onnx_context import GraphContext
from export.onnx_lstm import lstm_step_graph
from formats.export_spec import ExportSpec
from tests.helpers import tiny_options


@pytest.mark.parametrize("clips", [(3.0, 3.0), (0.5, 0.05), (0, 0)])
def test_onnx_step_equals_the_reference(clips):
    cfg = ElmoConfig.from_dict(tiny_options(lstm__cell_clip=clips[0], lstm__proj_clip=clips[1]))
    b = GraphContext(BiLM(cfg).eval(), ExportSpec.for_config(cfg))
    B, C, P = 3, cfg.lstm.dim, cfg.lstm.projection_dim
    rng = np.random.default_rng(0)
    w_state, w_proj = rng.normal(size=(P, 4 * C)), rng.normal(size=(C, P))
    feeds = {"h": rng.normal(size=(B, P)), "c": rng.normal(size=(B, C)), "gx": 2 * rng.normal(size=(B, 4 * C)),
             "m": np.array([[1.0], [1.0], [0.0]])}  # row 2 is padding: its output must be zero
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    g = b.g
    h, c, out = lstm_step_graph(b, g, "h", "c", "gx", "m", b.weight(w_state, "w_state"), b.weight(w_proj, "w_proj"))
    graph = helper.make_graph(
        g.nodes, "step", [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (h, c, out)], g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got_h, got_c, got_out = sess.run(None, feeds)

    t = {k: torch.from_numpy(v).double() for k, v in feeds.items()}
    gates = t["gx"] + t["h"] @ torch.from_numpy(w_state.astype(np.float32)).double()  # (B, 4C)
    ref_h, ref_c = lstm_step(gates[None], t["c"][None], torch.from_numpy(w_proj.astype(np.float32)).double()[None],
                             cfg.lstm.cell_clip, cfg.lstm.proj_clip)
    # ONNX Scan recurrence on ORT fp32 vs torch fp32: other kernels, errors amplified over the steps
    np.testing.assert_allclose(got_h, ref_h[0].numpy(), rtol=0, atol=2e-5)
    np.testing.assert_allclose(got_c, ref_c[0].numpy(), rtol=0, atol=2e-5)
    np.testing.assert_allclose(got_out, ref_h[0].numpy() * feeds["m"], rtol=0, atol=2e-5)
    assert not got_out[2].any()
