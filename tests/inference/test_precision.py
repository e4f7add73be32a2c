"""Reduced-precision inference (``inference.precision``): the matrix products in bf16 / fp16, the
rest in fp32; every token's cosine >= 0.999 against fp32, every layer, on the TF reference model
and its real sentences (the GPU figures are in tests/gpu and bench/bench_gpu.py)."""
from __future__ import annotations

import json

import pytest
import torch

from elmo_core.errors import InputError, SettingError
from formats import load_bilm
from inference.backends import TorchBackend
from inference.fast_path import FastInference
from inference.packed_gemm import packed_gemm_available
from inference.model_run import resolve_run
from inference.run_settings import RunSettings
from inference.precision import BF16_CPU_FLAGS, bf16_cpu_warning, check_precision, cpu_flags, resolve_precision
from pipelines.options import EmbedOptions


def _model_and_ids(fixture_dir):
    model = load_bilm(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5").eval()
    sentences = [s.split() for batch in json.loads((fixture_dir / "sentences.json").read_text()) for s in batch]
    return model, torch.from_numpy(model.tokenizer.batch(sentences))


def _min_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).min())


def _fp32_and(model, ids, fast: FastInference):
    """(the model's fp32 layers, fp32 mix, mask, layers and mix through ``fast``), checking every
    token's cosine >= 0.999 against fp32 for every layer and the mix."""
    weights = torch.tensor([0.2, 0.5, 0.3])
    with torch.inference_mode():
        ref, (ref_mixed, mask) = model.run(ids), model.run_combined(ids, weights)
        model.use_fast_path(fast)
        low, (low_mixed, _) = model.run(ids), model.run_combined(ids, weights)
    for layer in range(ref.layers.shape[1]):
        cos = _min_cosine(low.layers[:, layer][mask], ref.layers[:, layer][mask])
        assert cos >= 0.999, (fast.precision, layer, cos)
    assert _min_cosine(low_mixed[mask], ref_mixed[mask]) >= 0.999
    return ref.layers, ref_mixed, mask, low.layers, low_mixed


@pytest.mark.parametrize("precision,path", [("bf16", "plain"), ("bf16", "prepacked"), ("fp16", "plain"),
                                            ("bf16", "fused"), ("bf16", "rows"), ("bf16", "fused-layout")])
def test_reduced_precision_keeps_every_token_and_layer_within_cosine(fixture_dir, precision, path):
    """prepacked: bf16 through oneDNN's packed weights (the path of full-size models on x86 CPUs,
    forced here for the small fixture model); plain: batched products on bf16 weight copies;
    fused: CUDA's fused steps (``inference.fused_lstm``); rows: CUDA's static rows
    (``inference.row_lstm``, run eagerly), for the mix; fused-layout: a CPU's ``--layout fused``
    (compiled kernels on packed oneDNN weights, ``inference.layout``)."""
    from inference.row_lstm import RowShape

    model, ids = _model_and_ids(fixture_dir)
    if path == "fused-layout":
        fast = FastInference(model, precision, layout="fused")
    else:
        fast = FastInference(model, precision, packed_min_weights=0 if path == "prepacked" else 1 << 62,
                             fused=path == "fused", cuda_graphs=path == "rows", capture=False, rows=RowShape(8, 4))
    ref, _, mask, low, low_mixed = _fp32_and(model, ids, fast)
    assert (low - ref).abs().max() > 1e-5  # the products really ran in the reduced type
    assert low.dtype == torch.float32 and not low_mixed[~mask].any()
    assert fast.lstm.weight_copies()[1].dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert fast.lstm._packed_low() == (path in ("prepacked", "fused-layout") and packed_gemm_available(torch.device("cpu"))
                                        and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if path == "rows":
        assert fast.graphs.positions > 0  # the mix went through the rows


def test_back_to_fp32_is_bit_identical(fixture_dir):
    """A bf16 path leaves the model's fp32 weights as they were."""
    model, ids = _model_and_ids(fixture_dir)
    with torch.inference_mode():
        before = model.use_fast_path(FastInference(model)).run(ids).layers
        bf16 = model.use_fast_path(FastInference(model, "bf16")).run(ids).layers
        after = model.use_fast_path(FastInference(model)).run(ids).layers
    assert torch.equal(before, after) and not torch.equal(before, bf16)


def test_training_ignores_the_inference_precision(fixture_dir):
    model, ids = _model_and_ids(fixture_dir)
    want = model.run(ids).layers.detach()  # autograd path, fp32
    got = model.use_fast_path(FastInference(model, "bf16")).run(ids).layers.detach()
    assert torch.equal(got, want)


def test_unknown_or_misplaced_precisions_are_named(tmp_path, fixture_dir):
    with pytest.raises(InputError, match="precision must be one of"):
        check_precision("fp8", "cpu")
    with pytest.raises(InputError, match="tf32 is a CUDA tensor-core mode"):
        TorchBackend.from_files(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5", precision="tf32")
    model = {"model": fixture_dir / "options.json", "weights": fixture_dir / "lm_weights.hdf5"}
    with pytest.raises(InputError, match="tf32 is a CUDA"):  # the one check, where the run is resolved
        resolve_run(**model, precision="tf32")
    with pytest.raises(InputError, match="an onnx model runs its export's precision"):
        resolve_run(fixture_dir / "options.json", backend="onnx", precision="tf32")
    with pytest.raises(InputError, match="int8 runs on the onnx backend"):
        resolve_run(**model, precision="int8")
    with pytest.raises(SettingError, match="precision must be one of"):
        RunSettings(precision="fp8")
    assert RunSettings(backend="onnx", precision="int8").precision == "int8"  # the export's, recorded
    assert "precision" not in EmbedOptions().identity("torch", "fp32")  # fp32 jobs keep the identity they had
    assert EmbedOptions().identity("torch", "bf16")["precision"] == "bf16"  # a resume must keep it


def test_auto_follows_what_the_processor_reports():
    """--precision auto on masked flag sets: bf16 only where the CPU multiplies bf16 in hardware."""
    assert resolve_precision("auto", "cpu", flags=frozenset({"avx2", "avx512f"}))[0] == "fp32"
    for flag in BF16_CPU_FLAGS:
        precision, why = resolve_precision("auto", "cpu", flags=frozenset({"avx2", flag}))
        assert precision == "bf16" and flag in why
    assert resolve_precision("auto", "cuda:0", flags=frozenset())[0] == "bf16"
    assert resolve_precision("fp16", "cpu") == ("fp16", "asked for")


def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_about_or_refused():
    warning = bf16_cpu_warning("bf16", "cpu", flags=frozenset({"avx2", "avx512f"}))
    assert warning and "emulated" in warning.text and "--precision auto" in warning.text and not warning.scalar
    assert bf16_cpu_warning("fp16", "cpu", flags=frozenset({"avx2", "avx512f"})) is None
    for precision in ("bf16", "fp16"):  # AVX2 only: scalar products, 0.004x fp32 measured: a command refuses
        scalar = bf16_cpu_warning(precision, "cpu", flags=frozenset({"avx2", "fma"}))
        assert scalar and scalar.scalar and f"--precision {precision} on a CPU without AVX-512" in scalar.text
    assert bf16_cpu_warning("bf16", "cpu", flags=frozenset({"avx512_bf16"})) is None
    assert bf16_cpu_warning("fp32", "cpu", flags=frozenset()) is None
    assert bf16_cpu_warning("bf16", "cuda", flags=frozenset()) is None


def test_auto_meets_parity_on_this_machine(fixture_dir):
    """Whatever auto picks here (bf16 on AMX / AVX512-BF16 CPUs, else fp32), every token and the mix
    stay within cosine 0.999 of fp32."""
    precision, _ = resolve_precision("auto", "cpu")
    model, ids = _model_and_ids(fixture_dir)
    _fp32_and(model, ids, FastInference(model, precision))


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags\t\t: fpu avx2 amx_bf16\n")
    assert cpu_flags(info) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_two_cpus_with_one_name_are_two_cpus(tmp_path):
    """A VM names an AVX2-only EPYC and a Zen 5 alike: what is measured or compiled per CPU (layouts,
    ONNX Runtime's optimized models) is kept under the name, numbers and kernel flags together."""
    from inference.precision import cpu_model

    def cpu(name: str, family: int, model: int, flags: str) -> str:
        info = tmp_path / f"cpuinfo-{family}-{model}-{flags.replace(' ', '-')}"  # cpu_model reads a path once
        info.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\n"
                        f"model name\t: {name}\nstepping\t: 1\nflags\t\t: fpu {flags}\n\nprocessor\t: 1\n")
        return cpu_model(info)

    zen2, zen5 = cpu("AMD EPYC", 23, 49, "avx2 fma"), cpu("AMD EPYC", 26, 2, "avx2 avx512f avx512_bf16 avx512_vnni")
    assert zen2 == "AMD EPYC (family 23 model 49 stepping 1; avx2)"
    assert zen5 == "AMD EPYC (family 26 model 2 stepping 1; avx2 avx512f avx512_vnni avx512_bf16)"
    assert cpu("AMD EPYC", 23, 49, "sse4_2") == "AMD EPYC (family 23 model 49 stepping 1; none of the kernel flags)"
    arm = tmp_path / "cpuinfo-arm"  # Arm: no model name, Features for flags
    arm.write_text("processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd asimddp sve bf16 i8mm\n"
                   "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\n\n"
                   "processor\t: 1\nFeatures\t: fp asimd\n")
    assert cpu_model(arm).endswith("(implementer 0x41 part 0xd40 variant 0x1; asimddp sve bf16 i8mm)")
