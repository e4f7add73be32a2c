"""The ONNX Runtime backend: Embedder.from_onnx equals the torch backend; cache, checks, CLI."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from elmo_cli.main import main
from elmo_core import batch_to_ids
from elmo_core.errors import InputError
from export.build import build_for_machine
from formats.errors import ExportError
from elmo_core.vectors import VectorRequest
from export.onnx_export import export_onnx
from inference.embedder import Embedder
from inference.onnx_backend import CACHE_DIR, OnnxBackend
from tests.helpers import SENTENCES

QUICK = ((1, 1), (3, 8))


@pytest.fixture
def onnx_dir(tiny_dir, tmp_path) -> Path:
    export_onnx(tiny_dir, tmp_path / "onnx", threads=1, shapes=QUICK)
    return tmp_path / "onnx"


@pytest.mark.parametrize("output", ["all", "top", "mixed"])
def test_embed_sentences_equals_torch(tiny_dir, onnx_dir, output):
    kw = {"output": output, "mix_weights": [0.5, -0.2, 1.0], "gamma": 0.8} if output == "mixed" else {"output": output}
    with Embedder.from_files(tiny_dir) as ref, Embedder.from_onnx(onnx_dir, threads=1) as emb:
        want = ref.embed_sentences(SENTENCES + [[]], batch_size=2, **kw)
        got = emb.embed_sentences(SENTENCES + [[]], batch_size=2, **kw)
    assert emb.backend.name == "onnx"
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == np.float32
        # ONNX Runtime's fp32 kernels vs torch's (other GEMM, other sum orders, fused gates): ~1e-5 measured
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)


def test_fixture_embedder_parity(fixture_dir, tmp_path):
    export_onnx(fixture_dir / "options.json", tmp_path, threads=1, shapes=QUICK, weights=fixture_dir / "lm_weights.hdf5")
    sentences = [s.split() for batch in json.loads((fixture_dir / "sentences.json").read_text()) for s in batch]
    with Embedder.from_files(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5") as ref, \
            Embedder.from_onnx(tmp_path, threads=1) as emb:
        # ONNX Runtime's fp32 kernels vs torch's (other GEMM, other sum orders, fused gates): ~1e-5 measured
        for g, w in zip(emb.embed_sentences(sentences, batch_size=7), ref.embed_sentences(sentences, batch_size=7)):
            np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)


def test_optimized_model_is_cached_and_reused(onnx_dir):
    first = OnnxBackend(onnx_dir, threads=1)
    assert first.optimized_path is None  # optimized now, written to the cache
    cached = list((onnx_dir / CACHE_DIR).glob("model.all.*.onnx"))
    assert len(cached) == 1
    second = OnnxBackend(onnx_dir, threads=1)
    assert second.optimized_path == cached[0]
    ids = batch_to_ids(SENTENCES)
    for a, b in zip(first.run(ids), second.run(ids)):
        np.testing.assert_array_equal(a, b)
    plain = OnnxBackend(onnx_dir, threads=1, optimization="disable")
    # ORT's graph optimisations fuse and reorder fp32 ops
    np.testing.assert_allclose(plain.run(ids)[0], first.run(ids)[0], atol=1e-5)


def test_bad_inputs_and_tampered_exports(onnx_dir, tmp_path):
    backend = OnnxBackend(onnx_dir, threads=1)
    ids = batch_to_ids(SENTENCES[:2])
    with pytest.raises(InputError, match="left-aligned"):
        backend.run(np.ascontiguousarray(ids[:, ::-1]))
    with pytest.raises(InputError, match="int32"):
        backend.run(ids.astype(np.int64))
    with pytest.raises(InputError, match=r"shape \(batch, time, 50\)"):
        backend.run(ids[:, :, :10])
    absent = next(p for p in ("ROCMExecutionProvider", "MIGraphXExecutionProvider", "CUDAExecutionProvider")
                  if p not in ort.get_available_providers())
    with pytest.raises(ExportError, match=rf"providers \['{absent}'\] are not available here"):
        OnnxBackend(onnx_dir, providers=[absent])
    with pytest.raises(ExportError, match="no manifest.json"):
        OnnxBackend(tmp_path / "nowhere")
    data = (onnx_dir / "model.onnx").read_bytes()
    (onnx_dir / "model.onnx").write_bytes(data + b"\0")
    with pytest.raises(ExportError, match="does not match the manifest"):
        OnnxBackend(onnx_dir)


def test_mixed_export_backend(tiny_dir, tmp_path):
    export_onnx(tiny_dir, tmp_path / "x", VectorRequest("mixed", (1.0, 0.0, -1.0), 2.0), threads=1, shapes=QUICK)
    backend = OnnxBackend(tmp_path / "x", threads=1)
    ids = batch_to_ids(SENTENCES)
    mixed, mask = backend.run_mixed(ids)
    with Embedder.from_files(tiny_dir) as ref:
        layers, ref_mask = ref.backend.run(ids)
    w = np.exp([1.0, 0.0, -1.0]) / np.exp([1.0, 0.0, -1.0]).sum()
    # the ONNX mixed graph vs torch layers mixed in numpy: ORT vs torch kernels, as above
    np.testing.assert_allclose(mixed, 2.0 * np.einsum("l,bltd->btd", w, layers), atol=1e-4)
    np.testing.assert_array_equal(mask, ref_mask)
    with pytest.raises(ExportError, match="--output mixed"):
        backend.run(ids)


def test_cli_export_onnx(tiny_dir, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["export", "onnx", "--model", str(tiny_dir), "--out", str(out), "--output", "mixed",
                 "--mix", "0,1,0", "--gamma", "1.5", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "parity: " in text and " on 12 shapes" in text and (out / "model.onnx").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["spec"]["mix_weights"] == [0.0, 1.0, 0.0] and manifest["spec"]["gamma"] == 1.5
    assert main(["export", "onnx", "--model", str(tiny_dir), "--out", str(out), "--output", "mixed", "--mix", "1,2"]) == 2
    assert "expected 3 weights" in capsys.readouterr().err


def test_make_engine_without_tensorrt_builds_the_ort_model(tiny_dir, tmp_path, capsys):
    try:
        import tensorrt  # noqa: F401
        pytest.skip("TensorRT is installed here: this test covers the CPU fallback")
    except ImportError:
        pass
    assert main(["engine", "--model", str(tiny_dir), "--out", str(tmp_path), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "ONNX Runtime optimized fp32 model" in out and "no TensorRT: TensorRT is not installed" in out
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert "(CPUExecutionProvider, level all)" in out and "no CUDA: onnxruntime" in out
    report = build_for_machine(str(tiny_dir), tmp_path, threads=1)
    assert Path(report["path"]).is_file() and CACHE_DIR in report["path"]
    assert f"--backend onnx --model {tmp_path / 'onnx'}" in out  # the directory to pass, printed
    assert main(["engine", "--model", str(tiny_dir), "--out", str(tmp_path), "--threads", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == report["path"]  # --json: the report alone on stdout
    ids = batch_to_ids(SENTENCES)
    want = OnnxBackend(tmp_path / "onnx", threads=1).run(ids)[0]
    for given in (tmp_path, tmp_path / "onnx", Path(report["path"])):  # engine OUT, the export, the printed file
        with Embedder.open(given, "onnx", threads=1) as emb:
            np.testing.assert_array_equal(emb.backend.run(ids)[0], want)


def test_cuda_provider_defaults_and_overrides():
    from inference.onnx_backend import CUDA_DEFAULTS, _with_defaults

    assert _with_defaults("CUDAExecutionProvider") == ("CUDAExecutionProvider", CUDA_DEFAULTS)
    assert CUDA_DEFAULTS["use_tf32"] == 0 and CUDA_DEFAULTS["cudnn_conv_algo_search"] == "DEFAULT"
    name, options = _with_defaults(("CUDAExecutionProvider", {"use_tf32": 1, "device_id": 1}))
    assert name == "CUDAExecutionProvider" and options == {**CUDA_DEFAULTS, "use_tf32": 1, "device_id": 1}
    assert _with_defaults("CPUExecutionProvider") == "CPUExecutionProvider"
    trt = ("TensorrtExecutionProvider", {"trt_fp16_enable": True})
    assert _with_defaults(trt) is trt
