"""Per-token activation scales for int8 products (export/row_scales.py) and the plan that uses them
where they help (export/quantize.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from elmo_core.chars import batch_to_ids
from export.onnx_export import ort_run
from export.onnx_graph import build_onnx
from export.quantize import matmul_groups, plan_int8, quantize_int8, row_scalable
from export.row_scales import scale_rows
from export.text_parity import default_sample
from formats import load_bilm
from formats.export_spec import ExportSpec

from tests.export.test_quantize import GROUPS, _quantized_groups


def _one_product(path: Path, opset: int, rng: np.random.Generator) -> None:
    """Y = X W with W named as the char-CNN projection's weight (so it has a group)."""
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "proj_w_0")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "proj_w_0"], ["y"], name="MatMul_0")], "one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))


def _row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.mark.parametrize("opset", [17, 18])  # ReduceMax's axes: an attribute before 18, an input from 18
def test_per_token_scales_keep_each_tokens_own_range(tmp_path, opset):
    """Tokens 100x smaller than the batch's largest: one scale per tensor leaves them a few of its 256
    levels; their own scale gives each the 8-bit error of its own range (~1/255 of it a value, so a
    cosine error ~1e-5; 0.999 leaves margin)."""
    rng = np.random.default_rng(0)
    _one_product(tmp_path / "fp32.onnx", opset, rng)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    x[::2] *= 0.01  # every other token small
    x[5] = 0.0  # a padding token's zero row stays zero, not NaN
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1

    def run(name: str) -> np.ndarray:
        return ort.InferenceSession(str(tmp_path / name), opts, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    quantize_int8(tmp_path / "fp32.onnx", tmp_path / "plain.onnx", bits=8)
    quantize_int8(tmp_path / "fp32.onnx", tmp_path / "rows.onnx", bits=8, row_scaled=["char_cnn.projection"])
    ref, plain, rows = run("fp32.onnx"), run("plain.onnx"), run("rows.onnx")
    tokens = np.arange(64) != 5
    assert _row_cosines(ref[tokens], plain[tokens]).min() < 0.99
    assert _row_cosines(ref[tokens], rows[tokens]).min() >= 0.999
    assert np.all(np.isfinite(rows)) and not rows[5].any()  # zero is exact in int8


def test_per_token_scales_leave_the_fp32_graph_as_it_was(fp32_graph, tmp_path):
    """Dividing a token by its range and multiplying the product back adds two roundings a value
    (2^-24 each, relative): the outputs move by float32 rounding, far under 1e-5 of their size."""
    proto = onnx.load(str(fp32_graph))
    scalable = row_scalable(proto)
    assert set(scalable) == {"char_cnn.highway", "char_cnn.projection", "bilstm1.input", "bilstm2.input"}
    groups = matmul_groups(proto)
    scale_rows(proto, [n for g in scalable for n in groups[g]])
    onnx.save(proto, str(tmp_path / "rows.onnx"))
    spec = ExportSpec.for_config(load_bilm(fp32_graph.parent / "tiny").config)
    ids = batch_to_ids(default_sample(6)[0])  # rows of different lengths: padding tokens too
    ref, _ = ort_run(fp32_graph, spec, 1)(ids)
    got, _ = ort_run(tmp_path / "rows.onnx", spec, 1)(ids)
    assert np.all(np.isfinite(got)) and np.abs(got - ref).max() <= 1e-5 * max(1.0, float(np.abs(ref).max()))
    with pytest.raises(ValueError, match="main graph"):
        scale_rows(onnx.load(str(fp32_graph)), groups["bilstm1.recurrent"])


def _row_scaled_groups(path: Path, groups: dict[str, list[str]]) -> set[str]:
    names = {n.name for n in onnx.load(str(path)).graph.node}
    return {g for g, nodes in groups.items() if all(f"{n}_row_rescale" in names for n in nodes)}


def test_the_plan_gives_per_token_scales_only_to_the_groups_that_need_them(fp32_graph, tmp_path):
    """The real quantizer and files; the cosine a stand-in: 1 minus each int8 group's own error. The
    scales cost a pass over a product's output, so a group that fits as it is stays so (the second
    layer's input products, though 4x better with scales); the char-CNN projection fits only with them."""
    groups = matmul_groups(onnx.load(str(fp32_graph)))
    plain = {g: 1e-4 for g in GROUPS} | {"char_cnn.projection": 2e-3, "bilstm1.input": 6e-4, "bilstm2.input": 2e-4}
    rows = plain | {"char_cnn.projection": 2e-4, "bilstm1.input": 4e-4, "bilstm2.input": 0.5e-4}

    def measure(path: Path) -> float:
        scaled = _row_scaled_groups(path, groups)
        return 1.0 - sum((rows if g in scaled else plain)[g] for g in _quantized_groups(path, groups))
    plan = plan_int8(fp32_graph, tmp_path / "q.onnx", 0.999, measure, bits=8)
    # the five 1e-4 groups (5e-4), bilstm2.input as it is (7e-4), the projection with scales (9e-4;
    # it fails alone as it is, so it is ordered by its score with them); bilstm1.input refused both
    # ways (1.5e-3, 1.3e-3)
    assert plan.row_scaled == ["char_cnn.projection"] and plan.kept_fp32 == ["bilstm1.input"]
    assert _row_scaled_groups(tmp_path / "q.onnx", groups) == {"char_cnn.projection"}
    assert _quantized_groups(tmp_path / "q.onnx", groups) == set(plan.quantized) == GROUPS - {"bilstm1.input"}
    assert plan.min_cosine == pytest.approx(1 - 9e-4)
    assert set(plan.alone_rows) == {"char_cnn.highway", "char_cnn.projection", "bilstm1.input", "bilstm2.input"}
    assert "(per-token scales: char_cnn.projection)" in plan.describe()
    assert "bilstm1.input (0.999400 alone)" in plan.describe() and plan.to_dict()["row_scaled"] == ["char_cnn.projection"]


def test_the_plan_adds_per_token_products_first_by_error_per_multiply_add(tiny_dir):
    """A group's value is what its products cost a token (K x N of its weights, both directions);
    the char-CNN's run once per distinct token in a deduplicating graph, so they come last there."""
    from export.quantize import Int8Plan, group_values
    from elmo_core.vectors import VectorRequest

    bilm = load_bilm(tiny_dir)
    c = bilm.config.lstm  # P 8, cell 24: input and recurrent P x 4C, projection C x P, per direction
    for dedup in (False, True):
        spec = ExportSpec.for_config(bilm.config, VectorRequest("all"), "int8", token_dedup=dedup)
        values = group_values(build_onnx(bilm, spec))
        assert values["bilstm1.input"] == values["bilstm2.recurrent"] == 2 * c.projection_dim * 4 * c.dim
        assert values["bilstm1.projection"] == 2 * c.dim * c.projection_dim
        assert (values["char_cnn.highway"] == 0) == dedup and (values["char_cnn.projection"] == 0) == dedup
    plan = Int8Plan(0.999, alone={"bilstm1.input": 0.9996, "bilstm1.projection": 0.9998, "char_cnn.highway": 0.99999,
                                  "bilstm2.input": 0.9989},
                    alone_rows={"bilstm2.input": 0.99995, "char_cnn.highway": 0.99999})
    values = {"bilstm1.input": 4, "bilstm1.projection": 1, "char_cnn.highway": 0, "bilstm2.input": 4}
    # errors per multiply-add: bilstm2.input 5e-5 / 4 (with scales: it fails alone without), bilstm1.input
    # 4e-4 / 4, the projection 2e-4 / 1; the highway, however exact, after every per-token product
    assert plan.order(values) == ["bilstm2.input", "bilstm1.input", "bilstm1.projection", "char_cnn.highway"]
