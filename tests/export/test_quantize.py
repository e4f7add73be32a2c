"""int8 planned per model (export/quantize.py), parity on text naming the failing layer and time step
(export/text_parity.py), the fp32 advice of a failed precision, and ``--precision auto`` on the onnx
backend measuring the candidates and recording its choice (export/auto.py, inference/precision.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from corpora.sample import write_sample_corpus
from elmo_cli.main import main
from export.cache import cached_onnx_export
from export.errors import ParityError
from export.onnx_export import export_onnx, ort_run
from export.quantize import matmul_groups, plan_int8, quantize_int8, weight_bits
from export.tensorrt_ops import iter_graphs, iter_nodes
from export.text_parity import TextSample, default_sample
from formats import load_bilm
from formats.export_spec import TEXT_MIN_COSINE, ExportSpec
from inference.backends import TorchBackend
from inference.precision import MeasuredPrecision, fastest_validated
from pipelines.calibration import calibration_sample

from tests.helpers import read_record

GROUPS = {"char_cnn.highway", "char_cnn.projection", "bilstm1.input", "bilstm1.recurrent", "bilstm1.projection",
          "bilstm2.input", "bilstm2.recurrent", "bilstm2.projection"}


def test_every_product_has_a_group(fp32_graph):
    groups = matmul_groups(onnx.load(str(fp32_graph)))
    assert set(groups) == GROUPS
    matmuls = [n.name for n in iter_nodes(onnx.load(str(fp32_graph)).graph) if n.op_type == "MatMul"]
    assert sorted(matmuls) == sorted(n for names in groups.values() for n in names)
    assert all(len(groups[f"bilstm{k}.{kind}"]) == 2 for k in (1, 2) for kind in ("input", "recurrent", "projection"))


def _quantized_groups(path: Path, groups: dict[str, list[str]]) -> set[str]:
    """The groups none of whose MatMuls is left in ``path`` (the quantizer replaces them)."""
    left = {n.name for n in iter_nodes(onnx.load(str(path)).graph) if n.op_type == "MatMul"}
    return {g for g, names in groups.items() if not left & set(names)}


def test_kept_groups_stay_fp32(fp32_graph, tmp_path):
    groups = matmul_groups(onnx.load(str(fp32_graph)))
    quantize_int8(fp32_graph, tmp_path / "q.onnx", ["char_cnn.projection", "bilstm1.input"])
    assert _quantized_groups(tmp_path / "q.onnx", groups) == GROUPS - {"char_cnn.projection", "bilstm1.input"}


def test_int8_weights_are_8_bit_where_the_cpu_sums_int8_exactly_else_7_bit(fp32_graph, tmp_path):
    assert weight_bits(frozenset({"avx2", "fma"})) == 7  # AVX2 u8s8: saturating int16 pair sums
    assert weight_bits(frozenset({"avx2", "avx512f", "avx512bw"})) == 7  # AVX-512 without VNNI: the same
    for flag in ("avx512_vnni", "avx_vnni", "amx_int8"):
        assert weight_bits(frozenset({"avx2", flag})) == 8
    for bits, widest in ((7, 64), (8, 127)):
        quantize_int8(fp32_graph, tmp_path / f"q{bits}.onnx", bits=bits)
        weights = [onnx.numpy_helper.to_array(t) for n in iter_graphs(onnx.load(str(tmp_path / f"q{bits}.onnx")).graph)
                   for t in n.initializer if t.data_type == onnx.TensorProto.INT8]
        assert weights and max(int(np.abs(w.astype(np.int32)).max()) for w in weights) == widest


def test_the_plan_adds_groups_from_least_error_while_the_whole_holds(fp32_graph, tmp_path):
    """The real quantizer and files; the cosine a stand-in: 1 minus each int8 group's own error."""
    groups = matmul_groups(onnx.load(str(fp32_graph)))
    error = {g: 1e-4 for g in GROUPS} | {"char_cnn.projection": 2e-3, "bilstm1.input": 6e-4, "bilstm2.input": 4.5e-4}

    def measure(path: Path) -> float:
        return 1.0 - sum(error[g] for g in _quantized_groups(path, groups))
    plan = plan_int8(fp32_graph, tmp_path / "q.onnx", 0.999, measure, bits=8)
    assert plan.bits == 8 and plan.to_dict()["weight_bits"] == 8 and "int8 (8-bit weights)" in plan.describe()
    # the five 1e-4 groups first (5e-4 together), then bilstm2.input (9.5e-4 < 1e-3: kept int8), then
    # bilstm1.input (1.55e-3: refused); the projection fails alone and is never tried with the others
    assert set(plan.kept_fp32) == {"char_cnn.projection", "bilstm1.input"}
    assert _quantized_groups(tmp_path / "q.onnx", groups) == set(plan.quantized) == GROUPS - set(plan.kept_fp32)
    assert plan.min_cosine == pytest.approx(1 - 9.5e-4) and plan.all_quantized == pytest.approx(1 - 3.55e-3)
    assert "kept in fp32: char_cnn.projection (0.998000 alone)" in plan.describe()
    with pytest.raises(ParityError, match="each product group quantized alone drops"):
        plan_int8(fp32_graph, tmp_path / "q.onnx", 0.99999, measure)


def test_int8_export_holds_the_text_target_on_its_sample(tiny_dir, tmp_path):
    sentences, _ = default_sample(24)
    m = export_onnx(tiny_dir, tmp_path / "e", precision="int8", threads=1, shapes=[(3, 8)],
                    sample=(sentences[:12], "the first 12"))
    text = m["parity"]["text"]
    assert text["passed"] and text["min_cosine"] >= TEXT_MIN_COSINE["int8"] and len(text["per_layer"]) == 3
    assert set(m["int8"]["quantized"]) | set(m["int8"]["kept_fp32"]) == GROUPS
    bilm = load_bilm(tiny_dir)
    spec = ExportSpec.for_config(bilm.config, precision="int8")
    again = TextSample(sentences[:12], "again", TorchBackend(bilm, threads=1), spec)
    assert again.measure(ort_run(tmp_path / "e" / "model.onnx", spec, 1))["min_cosine"] == pytest.approx(
        text["min_cosine"], abs=1e-6)  # the manifest's figure is what the graph gives


def test_a_text_failure_names_layer_time_step_and_word_and_fp32_that_validates(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(TEXT_MIN_COSINE, "fp16", 1.0)  # no fp16 graph reaches it: a failure to report
    sample = (default_sample(8)[0], "eight sentences")
    with pytest.raises(ParityError) as e:
        cached_onnx_export(tiny_dir, "fp16", root=tmp_path / "c", sample=sample)
    msg = str(e.value)
    assert "beyond min token cosine 1.0 on eight sentences" in msg and "time step" in msg and "the word" in msg
    assert "layer" in msg and "fp32 validates for this model" in msg and "--precision auto" in msg
    assert [p.name.split("-")[0] for p in (tmp_path / "c" / "onnx").iterdir()] == ["fp32"]  # built, cached


def test_auto_picks_the_fastest_that_validates():
    measured = [MeasuredPrecision("int8", 0.9995, 2000.0), MeasuredPrecision("fp32", 1.0, 1500.0)]
    precision, why = fastest_validated(measured)
    assert precision == "int8" and "int8 2,000 tokens/s at min token cosine 0.999500" in why
    failed = [MeasuredPrecision("int8", None, failure="beyond"), MeasuredPrecision("fp32", 1.0, 1500.0)]
    assert fastest_validated(failed)[0] == "fp32"
    slower = [MeasuredPrecision("int8", 0.9995, 1400.0), MeasuredPrecision("fp32", 1.0, 1500.0)]
    assert fastest_validated(slower)[0] == "fp32"


def test_embed_auto_on_onnx_measures_once_and_records_the_choice(tiny_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path / "cache"))
    write_sample_corpus(tmp_path / "corpus", rows=40, files=1)
    args = ["--model", str(tiny_dir), "--backend", "onnx", "--precision", "auto", "--output", "mixed", "--quiet"]
    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "a"), *args]) == 0
    [record] = (tmp_path / "cache" / "onnx").glob("auto-*.json")
    chosen = json.loads(record.read_text())
    assert {c["precision"] for c in chosen["candidates"]} == {"int8", "fp32"}
    assert all(c["min_cosine"] >= TEXT_MIN_COSINE[c["precision"]] for c in chosen["candidates"])
    run = read_record(tmp_path / "a" / "_manifest.parquet")["run"]
    assert run["precision"] == chosen["precision"] and chosen["why"] in run["precision_reason"]
    assert "the first 40 rows of" in json.loads((Path(chosen["export"]) / "manifest.json").read_text())[
        "parity"]["text"]["source"]
    capsys.readouterr()
    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "b"), *args]) == 0
    assert "onnx: exporting" not in capsys.readouterr().err  # the record and the exports reused
    shutil.rmtree(chosen["export"])  # a cache entry removed only costs a rebuild (it failed for good: "no manifest.json")
    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "c"), *args]) == 0
    assert (Path(chosen["export"]) / "manifest.json").is_file()


def test_the_calibration_sample_is_the_inputs_first_rows(tmp_path):
    write_sample_corpus(tmp_path / "corpus", rows=30, files=2)
    sentences, source = calibration_sample(tmp_path / "corpus", rows=20)
    assert len(sentences) == 20 and all(sentences) and source.startswith("the first 20 rows of")
    (tmp_path / "lines.txt").write_text("one two .\nthree four five\n", encoding="utf-8")
    assert calibration_sample(tmp_path / "lines.txt")[0] == [["one", "two", "."], ["three", "four", "five"]]
    assert np.all([isinstance(t, str) for s in sentences for t in s])


def test_export_onnx_plans_and_validates_on_its_calibration_input(tiny_dir, tmp_path, capsys):
    lines = [" ".join(s) for s in default_sample(80)[0][64:]]
    (tmp_path / "mine.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "e"
    assert main(["export", "onnx", "--model", str(tiny_dir), "--out", str(out), "--precision", "int8",
                 "--calibration", str(tmp_path / "mine.txt"), "--threads", "1"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["parity"]["text"]["source"] == f"the first {len(lines)} rows of {tmp_path / 'mine.txt'}"
    assert m["parity"]["text"]["sentences"] == len(lines) and m["parity"]["text"]["passed"]
    capsys.readouterr()
    assert main(["info", "--model", str(out)]) == 0  # which products are int8, as the plan said
    assert f"int8 plan    {m['int8']['describe']}\n" in capsys.readouterr().out
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    capsys.readouterr()
    assert main(["export", "onnx", "--model", str(tiny_dir), "--out", str(tmp_path / "f"), "--precision", "int8",
                 "--calibration", str(tmp_path / "empty.txt")]) == 2
    err = capsys.readouterr().err
    assert "--calibration" in err and "empty.txt" in err and "no row with text" in err
    write_sample_corpus(tmp_path / "corpus", rows=10, files=1)  # elmo embed says the same, before writing
    assert main(["embed", "--text", str(tmp_path / "corpus"), "--out", str(tmp_path / "g"), "--model", str(tiny_dir), "--backend", "onnx",
                 "--precision", "int8", "--calibration", str(tmp_path / "empty.txt"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "empty.txt" in err and "no row with text" in err and not (tmp_path / "g").exists()


def test_the_int8_score_holds_the_random_shapes_floor_as_well_as_the_text_target(tiny_dir):
    """A graph exact on text but beyond the random shapes' floor on long rows scores below the
    target, so no plan keeps it and the export's validation, which holds both, cannot then fail."""
    from export.onnx_export import int8_score
    from export.validate import ShapeSample, reference

    bilm = load_bilm(tiny_dir)
    spec, torch_backend = ExportSpec.for_config(bilm.config, precision="int8"), TorchBackend(bilm, threads=1)
    short = [s for s in default_sample(40)[0] if len(s) <= 12][:8]
    text = TextSample(short, "short sentences", torch_backend, spec)
    shapes = ShapeSample(torch_backend, spec, [(3, 8), (1, 33)])
    g = np.random.default_rng(0)

    def run(ids, noise):  # torch's own output, off by ``noise`` (relative) on rows longer than the text
        out, mask = reference(torch_backend, spec, ids)
        if ids.shape[1] > 12:
            out = out + noise * np.abs(out).max() * g.standard_normal(out.shape).astype(out.dtype)
        return out, mask

    assert int8_score(lambda ids: run(ids, 0.0), text, shapes) == pytest.approx(1.0, abs=1e-6)
    far = [float(r["min_cosine"]) for r in shapes.rows(lambda ids: run(ids, 0.3))]
    assert min(far) < spec.tolerance.min_cosine  # beyond the shapes' floor, exact on the text
    assert int8_score(lambda ids: run(ids, 0.3), text, shapes) < TEXT_MIN_COSINE["int8"]
    with pytest.raises(ParityError, match="batch 1, time 33"):
        shapes.check(lambda ids: run(ids, 0.3))
