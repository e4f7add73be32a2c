"""TensorRT: everything around the engine that runs without a GPU; the engine tests need one."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from elmo_cli.main import build_parser, main
from elmo_core import batch_to_ids
from inference.errors import EngineMismatchError, ExportError, TensorRTUnavailableError
from export.onnx_export import export_onnx
from formats.export_spec import ExportSpec
from export.tensorrt import build_engine, parse_bt, profile_from_args, tensorrt_ep_providers
from inference.tensorrt_runtime import check_engine_manifest
from tests.helpers import SENTENCES

SPEC = ExportSpec(n_layers=3, dim=32, max_chars=50)
FP16_SPEC = ExportSpec(n_layers=3, dim=32, max_chars=50, precision="fp16")
MANIFEST = {"tensorrt": {"version": "10.13.0.35"}, "gpu": {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}}


def test_profile_shapes_come_from_the_spec():
    prof = profile_from_args(SPEC, "2,4", None, "32,128")
    assert prof == {"char_ids": ((2, 4, 50), (16, 32, 50), (32, 128, 50))}
    assert SPEC.profile((1, 1), (1, 1), (1, 1)) == {"char_ids": ((1, 1, 50),) * 3}
    with pytest.raises(ExportError, match="min <= opt <= max"):
        SPEC.profile((4, 1), (2, 8), (8, 8))
    with pytest.raises(ExportError, match="--max: expected BATCH,LENGTH"):
        parse_bt("64x256", "--max")


def test_engine_manifest_must_match_tensorrt_and_gpu():
    check_engine_manifest(MANIFEST, "10.13.0.35", {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"})
    with pytest.raises(EngineMismatchError, match=r"built with TensorRT 10.13.0.35, running TensorRT 10.14.1"):
        check_engine_manifest(MANIFEST, "10.14.1", MANIFEST["gpu"])
    other_gpu = {"name": "NVIDIA A100-SXM4-40GB", "compute_capability": "8.0"}
    with pytest.raises(EngineMismatchError, match="compute capability '9.0', this is '8.0'.*Rebuild it here"):
        check_engine_manifest(MANIFEST, "10.13.0.35", other_gpu)
    broken = copy.deepcopy(MANIFEST)
    del broken["gpu"]
    with pytest.raises(EngineMismatchError, match="GPU None"):
        check_engine_manifest(broken, "10.13.0.35", MANIFEST["gpu"])


def test_ort_tensorrt_execution_provider_options():
    providers = tensorrt_ep_providers(FP16_SPEC, FP16_SPEC.profile((1, 1), (8, 16), (64, 256)), "/tmp/cache")
    name, opts = providers[0]
    assert name == "TensorrtExecutionProvider" and providers[1] == "CUDAExecutionProvider"
    assert opts["trt_profile_min_shapes"] == "char_ids:1x1x50" and opts["trt_profile_max_shapes"] == "char_ids:64x256x50"
    assert opts["trt_fp16_enable"] is True and opts["trt_engine_cache_enable"] is True


def test_cli_tensorrt_arguments():
    args = build_parser().parse_args(["export", "tensorrt", "--model", "a", "--out", "b", "--min", "1,2", "--opt",
                                      "4,16", "--max", "8,64", "--precision", "fp16", "--workspace", "1024"])
    assert (args.min, args.opt, args.max, args.precision, args.workspace) == ("1,2", "4,16", "8,64", "fp16",
                                                                                      1024)
    args = build_parser().parse_args(["export", "tensorrt", "--model", "a", "--out", "b"])
    assert (args.min, args.precision, args.workspace) == (None, None, 4096)


def test_build_engine_checks_before_needing_a_gpu(tiny_dir, tmp_path, capsys):
    export_onnx(tiny_dir, tmp_path / "onnx", threads=1, shapes=((1, 1),))
    with pytest.raises(ExportError, match="fp32 export; .* a fp16 engine needs `elmo export onnx --precision fp16`"):
        build_engine(tmp_path / "onnx", tmp_path / "trt", precision="fp16")
    export_onnx(tiny_dir, tmp_path / "int8", precision="int8", threads=1, shapes=((1, 1),))
    with pytest.raises(ExportError, match="int8 export; .* a fp32/fp16 engine needs"):
        build_engine(tmp_path / "int8", tmp_path / "trt")
    with pytest.raises(ExportError, match="no manifest.json"):
        build_engine(tmp_path, tmp_path / "trt")
    export_onnx(tiny_dir, tmp_path / "dedup", threads=1, shapes=((1, 1),), token_dedup=True)
    with pytest.raises(ExportError, match="Unique.*without --token-dedup"):
        build_engine(tmp_path / "dedup", tmp_path / "trt")
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(TensorRTUnavailableError, match=r"pip install '\.\[tensorrt\]'"):
            build_engine(tmp_path / "onnx", tmp_path / "trt")
        assert main(["export", "tensorrt", "--model", str(tmp_path / "onnx"), "--out", str(tmp_path / "t")]) == 2
        assert "TensorRT is not installed" in capsys.readouterr().err


def _gpu_engine_dir(tiny_dir: Path, tmp_path: Path, precision: str) -> Path:
    pytest.importorskip("tensorrt", reason="TensorRT is the optional `tensorrt` extra (GPU machines only)")
    from inference.tensorrt_runtime import gpu_identity

    try:
        gpu_identity()
    except TensorRTUnavailableError as e:
        pytest.skip(f"no CUDA GPU: {e}")
    export_onnx(tiny_dir, tmp_path / "onnx", precision=precision, threads=1, shapes=((1, 1),))
    build_engine(tmp_path / "onnx", tmp_path / "trt", "1,1", "4,16", "16,64", precision)
    return tmp_path / "trt"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tensorrt_engine_parity(tiny_dir, tmp_path, precision):
    from formats.export_spec import TENSORRT_TOLERANCES
    from export.validate import compare
    from inference.backends import TorchBackend
    from inference.tensorrt_backend import TensorRTBackend

    engine_dir = _gpu_engine_dir(tiny_dir, tmp_path, precision)
    ids = batch_to_ids(SENTENCES)
    with TensorRTBackend(engine_dir) as trt_backend, TorchBackend.from_files(tiny_dir) as ref:
        for _ in range(2):  # the second call reuses the device buffers
            figures = compare(trt_backend.run(ids), ref.run(ids))
    tol = TENSORRT_TOLERANCES[precision]
    assert tol.max_abs is None or figures["max_abs"] <= tol.max_abs, figures
    assert tol.min_cosine is None or figures["min_cosine"] >= tol.min_cosine, figures
    assert np.isfinite(figures["max_abs"])
