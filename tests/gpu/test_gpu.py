"""GPU paths: the torch backend on CUDA (its precisions, its CUDA graphs), ONNX Runtime's CUDA and
TensorRT execution providers, and `elmo embed --device cuda`.

Each test skips with its reason where there is no CUDA GPU or the provider is missing (CI has
neither; the `gpu` extra installs onnxruntime-gpu). Tolerances are the issue's GPU ones
(TENSORRT_TOLERANCES: fp32 max |diff| <= 1e-3, fp16 min token cosine >= 0.999), checked against the
torch backend on the CPU in fp32, on the spec's validation shapes (not the export example).
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow.dataset as ds
import pytest
import torch

from formats.errors import ExportError
from export.onnx_export import export_onnx
from formats.export_spec import TENSORRT_TOLERANCES, ExportSpec
from export.tensorrt import profile_from_args, tensorrt_ep_providers
from export.validate import check_parity
from inference.backends import TorchBackend
from inference.cuda_graphs import RowGraphs
from inference.fused_lstm import FusedLstm
from inference.embedder import Embedder
from inference.onnx_backend import OnnxBackend
from elmo_core.vectors import VectorRequest
from pipelines import embed_parquet
from corpora.sample import write_sample_corpus


def _need_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here (torch.cuda.is_available() is False)")


def _need_provider(name: str) -> None:
    import onnxruntime as ort

    _need_cuda()
    if name not in ort.get_available_providers():
        pytest.skip(f"this onnxruntime {ort.__version__} has no {name} (it has {ort.get_available_providers()}); "
                    f"the `gpu` extra installs onnxruntime-gpu")


def _fixture_sentences(fixture_dir) -> list[list[str]]:
    return [s.split() for batch in json.loads((fixture_dir / "sentences.json").read_text()) for s in batch]


def test_torch_cuda_matches_cpu(fixture_dir):
    _need_cuda()
    files = (fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5")
    sentences = _fixture_sentences(fixture_dir)
    with Embedder.from_files(*files) as cpu, Embedder.from_files(*files, device="cuda", precision="fp32") as gpu:
        assert next(gpu.backend.model.parameters()).is_cuda
        want = cpu.embed_sentences(sentences, batch_size=3)
        got = gpu.embed_sentences(sentences, batch_size=3)
    worst = max(float(np.abs(g - w).max(initial=0.0)) for g, w in zip(got, want))
    assert worst <= TENSORRT_TOLERANCES["fp32"].max_abs, worst


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_onnx_cuda_provider_parity(fixture_dir, tmp_path, precision):
    _need_provider("CUDAExecutionProvider")
    m = export_onnx(fixture_dir / "options.json", tmp_path, precision=precision, threads=2, shapes=((1, 1),),
                    weights=fixture_dir / "lm_weights.hdf5")
    spec = ExportSpec.from_dict(m["spec"])
    with OnnxBackend(tmp_path, providers=["CUDAExecutionProvider"]) as backend, \
            TorchBackend.from_files(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5") as ref:
        assert backend.use_iobinding and backend.session.get_providers()[0] == "CUDAExecutionProvider"
        figures = check_parity(backend.run, ref, spec, tolerance=TENSORRT_TOLERANCES[precision], label="ORT CUDA")
    assert len(figures["shapes"]) == len(spec.validation_shapes) and np.isfinite(figures["max_abs"])


def test_onnx_tensorrt_provider_parity_or_clear_error(fixture_dir, tmp_path):
    """ONNX Runtime's TensorRT provider (the alternative path); without libnvinfer, a clear error."""
    _need_provider("TensorrtExecutionProvider")
    m = export_onnx(fixture_dir / "options.json", tmp_path / "onnx", threads=2, shapes=((1, 1),),
                    weights=fixture_dir / "lm_weights.hdf5")
    spec = ExportSpec.from_dict(m["spec"])
    providers = tensorrt_ep_providers(spec, profile_from_args(spec, None, None, None), tmp_path / "trt")
    try:
        backend = OnnxBackend(tmp_path / "onnx", providers=providers)
    except ExportError as e:
        assert "could not enable TensorrtExecutionProvider" in str(e) and "libnvinfer" in str(e)
        pytest.skip(f"TensorRT's libraries are not installed: {e}")
    with backend, TorchBackend.from_files(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5") as ref:
        check_parity(backend.run, ref, spec, tolerance=TENSORRT_TOLERANCES["fp32"], label="ORT TensorRT EP")


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_embed_parquet_on_cuda_matches_cpu(tiny_dir, tmp_path, backend):
    """`elmo embed --device cuda`: the same rows and, within the GPU tolerance, the same vectors."""
    if backend == "onnx":
        _need_provider("CUDAExecutionProvider")
    _need_cuda()
    corpus, model = tmp_path / "corpus", tiny_dir
    write_sample_corpus(corpus, rows=120, files=2, row_group_rows=50)
    if backend == "onnx":
        export_onnx(tiny_dir, tmp_path / "onnx", threads=2, shapes=((1, 1),))
        model = tmp_path / "onnx"
    tables = {}
    for device in ("cpu", "cuda"):
        m = embed_parquet(corpus, tmp_path / device, model, backend=backend, device=device, id_column="id",
                          max_tokens_per_batch=2048, sort_window_rows=64, quiet=True,
                          precision="fp32" if backend == "torch" else None)
        assert m["rows"] == 120 and m["run"]["device"] == device
        if device == "cuda" and backend == "torch":  # GPU memory and the CUDA graphs, reported
            assert m["engine"]["gpu_peak_allocated_bytes"] > 0 and m["engine"]["cuda_graphs"]["captured"] >= 1
        tables[device] = ds.dataset(tmp_path / device, format="parquet").to_table()
    assert tables["cuda"].column("id").to_pylist() == tables["cpu"].column("id").to_pylist()
    pairs = zip(tables["cuda"].column("elmo").to_pylist(), tables["cpu"].column("elmo").to_pylist())
    worst = max(float(np.abs(np.asarray(g, np.float32) - np.asarray(w, np.float32)).max(initial=0.0))
                for g, w in pairs if w is not None)
    assert worst <= TENSORRT_TOLERANCES["fp32"].max_abs, worst


def test_cuda_defaults_are_the_devices(tiny_dir):
    """On CUDA the run's batch budget is sized to the GPU's memory (>= 131,072 tokens on an 80 GB
    card), the default precision is auto (bf16), and a GPU index this process cannot see is refused."""
    from inference.errors import BackendUnavailableError
    from inference.model_run import resolve_run

    _need_cuda()
    last = f"cuda:{torch.cuda.device_count() - 1}"
    run = resolve_run(tiny_dir, device=last)
    memory = torch.cuda.get_device_properties(torch.device(last)).total_memory
    assert run.precision == "bf16" and "the default on CUDA" in run.precision_reason
    assert run.batch.tokens >= (131072 if memory >= 79 << 30 else 4096), run.batch
    assert run.batch.window_tokens == 8 * run.batch.tokens and str(run.batch.tokens // 1000) in run.describe()
    with Embedder.open(tiny_dir, device=last) as e:
        assert e.policy.max_tokens_per_batch == run.batch.tokens
        assert next(e.backend.model.parameters()).device == torch.device(last)
        assert len(e.embed_sentences([["a", "b"], ["c"]])) == 2
    with pytest.raises(BackendUnavailableError, match=r"sees \d+ GPU"):
        resolve_run(tiny_dir, device=f"cuda:{torch.cuda.device_count()}")


def test_a_server_warms_every_row_count_its_batches_take(tiny_dir):
    """After the warm-up, no batch the server forms captures a graph: every row count is held."""
    from inference.model_run import resolve_run
    from serving.limits import ServeLimits
    from serving.service import SentencePredictor

    _need_cuda()
    predictor = SentencePredictor(resolve_run(tiny_dir, device="cuda"), ServeLimits())
    try:
        assert predictor.warm_up() == [8, 16, 32, 64, 128, 256, 512, 1024]
        graphs = predictor.embedder.backend.fast.graphs
        captured = graphs.captures
        for n in (1, 9, 300, 1000):
            predictor(VectorRequest(), [["a", "b", "c"]] * n)
        assert graphs.captures == captured
    finally:
        predictor.close()


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_torch_cuda_precisions_against_cpu_fp32(fixture_dir, precision):
    """Every layer (``run``, eager) and the mix (``run_combined``, CUDA graphs) against CPU fp32:
    fp32 max |diff| <= 1e-3; tf32, bf16, fp16 every token's cosine >= 0.999."""
    _need_cuda()
    files = (fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5")
    ids = TorchBackend.from_files(*files).tokenizer.batch(_fixture_sentences(fixture_dir))
    weights = np.array([0.2, 0.5, 0.3], np.float32)
    tol = TENSORRT_TOLERANCES[precision]
    with TorchBackend.from_files(*files) as cpu, TorchBackend.from_files(*files, device="cuda", precision=precision) as gpu:
        assert isinstance(gpu.fast.graphs, RowGraphs) and isinstance(gpu.fast.lstm, FusedLstm)  # fused on CUDA
        pairs = [(gpu.run(ids)[0][:, j], cpu.run(ids)[0][:, j]) for j in range(3)]  # (B, T, 2P) per layer
        pairs.append((gpu.run_combined(ids, weights)[0], cpu.run_combined(ids, weights)[0]))
        mask = cpu.run(ids)[1]
        assert gpu.fast.graphs.captures >= 1
    for got, want in pairs:
        got, want = got[mask].astype(np.float64), want[mask].astype(np.float64)  # (N, 2P)
        if tol.max_abs is not None:
            assert np.abs(got - want).max() <= tol.max_abs
        cos = (got * want).sum(1) / np.maximum(np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1), 1e-30)
        assert cos.min() >= (tol.min_cosine or 0.999), cos.min()


def test_cuda_graph_replays_equal_eager_cuda(fixture_dir):
    """One graph of one window, captured once and replayed for every window of every batch (the
    state carried between windows), gives the eager path's vectors."""
    _need_cuda()
    files = (fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5")
    sentences = _fixture_sentences(fixture_dir)
    weights = np.array([0.2, 0.5, 0.3], np.float32)
    with TorchBackend.from_files(*files, device="cuda") as graphed, \
            TorchBackend.from_files(*files, device="cuda", cuda_graphs=False) as eager:
        assert eager.fast.graphs is None
        for start in range(0, len(sentences) - 5, 2):  # overlapping batches of other sizes: one graph
            ids = graphed.tokenizer.batch(sentences[start : start + 6])
            got, mask = graphed.run_combined(ids, weights)
            want, want_mask = eager.run_combined(ids, weights)
            assert np.array_equal(mask, want_mask)
            # CUDA fp32 vs CUDA fp32 in another batch shape: other kernels' sum orders
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        stack = graphed.fast.graphs
        assert stack.replays > stack.captures == 1


@pytest.mark.parametrize("rows", [8, 16])
def test_a_recurrent_step_launches_four_kernels(fixture_dir, tmp_path, rows):
    """Two products and two compiled kernels a step (one layer, both directions), counted by the CUDA
    profiler as ``gpu_check``'s ``kernels`` step counts them: the difference of an 8- and a 4-step
    window. At 8 rows the H200 counted 4.5 before the keep mask's rows were laid 16 bytes apart
    (``inference.row_lstm.keep_buffer``): a copy of every other step's misaligned mask."""
    _need_cuda()
    from bench.gpu_check import step_kernels

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "options.json").write_text((fixture_dir / "options.json").read_text())
    got = step_kernels(tmp_path, "cuda", rows=rows)
    assert got["kernels_per_step"] <= 4, got["by_kernel"]
