"""ONNX export: graph structure (Scan, TensorRT-parsable ops, float mask reductions), hard parity, manifest."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from elmo_core import BiLM, ElmoConfig, batch_to_ids
from elmo_core.errors import InputError
from elmo_core.init import init_bilm
from storage.locations import file_sha256
from export.errors import ParityError
from export.onnx_export import export_onnx, ort_run
from export.onnx_graph import build_onnx
from export.tensorrt_ops import TENSORRT_SUPPORTED_OPS, iter_nodes
from export.validate import check_parity
from formats import load_bilm
from formats.errors import ExportError
from elmo_core.vectors import VectorRequest
from formats.export_spec import VALIDATION_BATCHES, VALIDATION_TIMES, ExportSpec, Tolerance
from inference.backends import TorchBackend

from tests.helpers import TINY_OPTIONS, make_model_dir

QUICK = ((1, 1), (3, 8), (2, 33))
# Marked "N" in onnx-tensorrt's docs/operators.md (see export.tensorrt_ops): a graph with any of these cannot be parsed
TENSORRT_UNSUPPORTED_OPS = frozenset({
    "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength",
    "SequenceMap", "SplitToSequence", "ConcatFromSequence", "Unique", "DynamicQuantizeLinear", "MatMulInteger",
    "ConvInteger", "Optional", "OptionalGetElement", "OptionalHasElement",
})


def fixture_model(fixture_dir: Path) -> dict:
    return {"model": fixture_dir / "options.json", "weights": fixture_dir / "lm_weights.hdf5"}


def test_graph_is_scan_based_tensorrt_parsable_and_checked(tiny_dir):
    bilm = load_bilm(tiny_dir)
    model = build_onnx(bilm, ExportSpec.for_config(bilm.config))
    onnx.checker.check_model(model, full_check=True)
    top = [n.op_type for n in model.graph.node]
    everything = [n.op_type for n in iter_nodes(model.graph)]
    assert top.count("Scan") == bilm.config.lstm.n_layers  # one Scan over time per layer, not unrolled
    assert "Loop" not in everything and not any(op.startswith("Sequence") for op in everything)
    assert len(everything) > len(top)  # the walk went into the Scan bodies
    unsupported = sorted({op for op in everything if op not in TENSORRT_SUPPORTED_OPS})
    assert unsupported == [], f"ops TensorRT's ONNX parser does not support: {unsupported}"
    assert not set(everything) & TENSORRT_UNSUPPORTED_OPS
    # input projections for all timesteps: one MatMul per direction and layer, outside the Scan
    n_hw = bilm.config.char_cnn.n_highway
    assert top.count("MatMul") == 2 * bilm.config.lstm.n_layers + n_hw + 1
    body = next(n for n in model.graph.node if n.op_type == "Scan").attribute[0].g
    assert [n.op_type for n in body.node].count("MatMul") == 2 * 2  # recurrent and projection, per direction


def test_reductions_never_run_on_int64(tiny_dir):
    bilm = load_bilm(tiny_dir)
    model = onnx.shape_inference.infer_shapes(build_onnx(bilm, ExportSpec.for_config(bilm.config)))
    types = {v.name: v.type.tensor_type.elem_type for v in list(model.graph.value_info) + list(model.graph.input)}
    reductions = [n for n in iter_nodes(model.graph) if n.op_type.startswith("Reduce")]
    assert reductions
    for node in reductions:
        assert types[node.input[0]] == TensorProto.FLOAT, f"{node.name} reduces a {types[node.input[0]]} tensor"


def test_fixture_parity_on_every_spec_shape(fixture_dir, tmp_path):
    m = export_onnx(out_dir=tmp_path / "x", threads=1, **fixture_model(fixture_dir))
    par = m["parity"]
    shapes = {(r["batch"], r["time"]) for r in par["shapes"]}
    assert shapes == {(b, t) for b in VALIDATION_BATCHES for t in VALIDATION_TIMES}
    # ORT's fp32 kernels vs torch's on the full graph: measured ~1e-5 (the export's own tolerance)
    assert par["passed"] and par["max_abs"] <= 1e-4, par
    assert all(r["max_abs"] <= 1e-4 for r in par["shapes"])
    saved = json.loads((tmp_path / "x" / "manifest.json").read_text())
    assert saved["source"]["weights_sha256"] == file_sha256(fixture_dir / "lm_weights.hdf5")
    assert saved["onnx"]["sha256"] == file_sha256(tmp_path / "x" / "model.onnx")
    assert saved["onnx"]["opset"] == 17 and saved["precision"] == "fp32" and saved["onnx"]["tensorrt_parsable"]
    assert saved["inputs"] == [{"name": "char_ids", "dtype": "int32", "shape": ["batch", "time", 50],
                                "dynamic_axes": {"0": "batch", "1": "time"}}]
    assert [o["name"] for o in saved["outputs"]] == ["layers", "mask"]
    assert saved["outputs"][0]["shape"] == ["batch", 3, "time", 32]
    graph = onnx.load(str(tmp_path / "x" / "model.onnx"))
    dims = [d.dim_param or d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "time", 50]


def test_parity_failure_raises_and_leaves_no_manifest(tiny_dir, tmp_path):
    other = make_model_dir(tmp_path / "other", TINY_OPTIONS, seed=7)
    export_onnx(other, tmp_path / "x", threads=1, shapes=QUICK)
    spec = ExportSpec.for_config(load_bilm(tiny_dir).config)
    wrong = ort_run(tmp_path / "x" / "model.onnx", spec, threads=1)  # another model's graph
    with pytest.raises(ParityError, match="differs from the torch backend"):
        check_parity(wrong, TorchBackend(load_bilm(tiny_dir)), spec, QUICK)
    with pytest.raises(ParityError):  # an impossible tolerance fails too: nothing is only printed
        export_onnx(tiny_dir, tmp_path / "y", threads=1, shapes=QUICK)  # passes
        check_parity(ort_run(tmp_path / "y" / "model.onnx", spec, 1), TorchBackend(load_bilm(tiny_dir)), spec,
                     QUICK, tolerance=Tolerance(max_abs=0.0, min_cosine=1.0 + 1e-9))


@pytest.mark.parametrize("opset", [18, 20])
def test_mixed_output_and_other_opsets(tiny_dir, tmp_path, opset):
    m = export_onnx(tiny_dir, tmp_path / "x", VectorRequest("mixed", (0.3, -1.0, 2.0), 0.5), opset=opset,
                    threads=1, shapes=QUICK)
    # as above: ORT vs torch fp32 kernels
    assert m["parity"]["max_abs"] <= 1e-4 and m["outputs"][0]["shape"] == ["batch", "time", 16]
    assert m["onnx"]["opset"] == opset


@pytest.mark.parametrize("precision,ops", [("fp16", {"Cast", "MatMul"}), ("int8", {"MatMulInteger"})])
def test_reduced_precision_variants(tiny_dir, tmp_path, precision, ops):
    m = export_onnx(tiny_dir, tmp_path / "x", precision=precision, threads=1, shapes=QUICK)
    assert m["parity"]["min_cosine"] >= ExportSpec.for_config(load_bilm(tiny_dir).config,
                                                             precision=precision).tolerance.min_cosine
    assert ops <= set(m["onnx"]["op_types"])
    assert m["onnx"]["tensorrt_parsable"] == (precision != "int8")
    if precision == "int8":  # the recurrent MatMuls inside the Scan bodies are quantized too
        body_ops = {n.op_type for n in iter_nodes(onnx.load(str(tmp_path / "x" / "model.onnx")).graph)}
        assert "MatMul" not in body_ops


def test_bad_export_options(tiny_dir, tmp_path):
    with pytest.raises(ExportError, match="expected 3 weights"):
        export_onnx(tiny_dir, tmp_path / "x", VectorRequest("mixed", (1.0, 2.0)))
    with pytest.raises(InputError, match="gamma only applies to the mix"):
        VectorRequest("all", gamma=2.0)
    with pytest.raises(ExportError, match="an export's graph gives float32 layers"):
        export_onnx(tiny_dir, tmp_path / "x", VectorRequest("top"))
    with pytest.raises(ExportError, match="opset 12 is not supported"):
        export_onnx(tiny_dir, tmp_path / "x", opset=12)


FULL = {"lstm": {"dim": 4096, "projection_dim": 512, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
                 "use_skip_connections": True},
        "char_cnn": {"embedding": {"dim": 16}, "n_highway": 2, "n_characters": 262, "max_characters_per_token": 50,
                     "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                     "activation": "relu"}}


@pytest.mark.slow
def test_full_size_architecture_parity():
    """The published full-size architecture (93M params, ~3 GB RAM, ~15 s) on three of the spec's shapes."""
    import onnxruntime as ort

    bilm = init_bilm(BiLM(ElmoConfig.from_dict(FULL)), seed=0).eval()
    spec = ExportSpec.for_config(bilm.config)
    sess = ort.InferenceSession(build_onnx(bilm, spec).SerializeToString(), providers=["CPUExecutionProvider"])
    par = check_parity(lambda ids: tuple(sess.run(None, {"char_ids": ids})), TorchBackend(bilm), spec,
                       ((1, 1), (3, 8), (1, 33)))
    # as above: ORT vs torch fp32 kernels
    assert par["max_abs"] <= 1e-4, par


def test_bf16_graph_exports_for_tensorrt_but_cannot_validate_on_cpu(tiny_dir, tmp_path):
    with pytest.raises(InputError, match=r"--precision bf16: ONNX Runtime's CPU provider cannot run bf16 products.*"
                                         r"export with --no-validate"):  # asked first, not after a build (a temp path)
        export_onnx(tiny_dir, tmp_path / "v", precision="bf16", threads=1, shapes=((1, 1),))
    assert not (tmp_path / "v").exists()
    m = export_onnx(tiny_dir, tmp_path / "n", precision="bf16", validate=False)
    assert m["parity"]["passed"] is None and m["onnx"]["tensorrt_parsable"]
    model = onnx.load(str(tmp_path / "n" / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    types = {t.data_type for g in [model.graph] + [a.g for n in model.graph.node for a in n.attribute if a.g.name]
             for t in g.initializer}
    assert TensorProto.BFLOAT16 in types and TensorProto.FLOAT in types


def test_token_dedup_export_matches_torch_and_is_marked_onnxruntime_only(fixture_dir, tmp_path):
    """--token-dedup: the char-CNN runs once per distinct token (Unique); parity holds on every spec shape."""
    m = export_onnx(out_dir=tmp_path / "x", threads=1, token_dedup=True, **fixture_model(fixture_dir))
    # as above: ORT vs torch fp32 kernels
    assert m["parity"]["passed"] and m["parity"]["max_abs"] <= 1e-4
    assert len(m["parity"]["shapes"]) == len(VALIDATION_BATCHES) * len(VALIDATION_TIMES)
    assert "Unique" in m["onnx"]["op_types"] and not m["onnx"]["tensorrt_parsable"]
    assert m["spec"]["token_dedup"] is True
    from inference.onnx_backend import OnnxBackend

    with OnnxBackend(tmp_path / "x", threads=1) as backend:
        assert backend.spec.token_dedup  # read back from the manifest
        ids = batch_to_ids([["the", "the", "cat"], ["cat", "the"]])  # (2, 3, 50): repeats and a padded slot
        layers, _ = backend.run(ids)
        ref, _ = TorchBackend(load_bilm(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5")).run(ids)
        # ORT fp32 vs torch fp32 on a tiny model: other kernels, other sum orders
        np.testing.assert_allclose(layers, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dedup", [False, True])
def test_rows_do_not_depend_on_their_batch(tiny_dir, tmp_path, dedup):
    """Padded steps do not hold the state: a row gives the same vectors alone and beside longer,
    shorter and empty rows, in either graph, and zeros at its padding."""
    export_onnx(tiny_dir, tmp_path / "x", threads=1, shapes=((1, 1),), token_dedup=dedup)
    run = ort_run(tmp_path / "x" / "model.onnx", ExportSpec.for_config(load_bilm(tiny_dir).config), 1)
    row = "The cat sat on the mat .".split()
    others = ["A much longer sentence , with punctuation and numbers like 1 , 2 in it .".split(), [], ["Hi"]]
    alone, _ = run(batch_to_ids([row]))  # (1, L+1, T, 2P)
    batched, mask = run(batch_to_ids([others[0], row, *others[1:]]))  # (4, L+1, T', 2P)
    T = len(row)
    # the same ORT graph on another batch shape: fp32 sums of K <= 64 terms in another order, ~sqrt(K) ulp
    np.testing.assert_allclose(batched[1, :, :T], alone[0], rtol=0, atol=1e-6)
    assert not batched[1, :, T:].any() and not batched[2].any()  # zeros at padding and for the empty row
    assert mask.sum(1).tolist() == [len(others[0]), T, 0, 1]
