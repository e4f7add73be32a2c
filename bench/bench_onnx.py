"""Torch backend vs ONNX Runtime fp32 vs reduced precision (fp16, int8), same run, real sentences.

    .venv/bin/python bench/bench_onnx.py            # full-size architecture (random weights), 2 threads
    .venv/bin/python bench/bench_onnx.py --quick    # a small architecture and few sentences (smoke run)

Speed: tokens/s of Embedder.embed_sentences(output='mixed') per backend, and ratios vs torch and vs
the first ONNX variant (plain fp32, the TensorRT-parsable graph). ``+dedup`` variants run the
char-CNN once per distinct token of a batch (``--token-dedup``, ONNX Runtime only). Then ONNX
Runtime's fp32 and int8 MatMuls alone at the model's shapes: the ceiling of int8's gain here. Accuracy:
per-token cosine and max |diff| of the mixed vectors against the torch fp32 backend (target:
cosine >= 0.999 for every token). bf16 is listed but ONNX Runtime's CPU provider
has no bf16 MatMul kernel, so its graph only runs under TensorRT / GPU providers.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corpora.sotu import sotu_sentences  # noqa: E402
import torch  # noqa: E402
from elmo_core import BiLM, ElmoConfig  # noqa: E402
from elmo_core.init import init_bilm  # noqa: E402
from export.onnx_export import export_onnx  # noqa: E402
from export.quantize import quantize_int8, weight_bits  # noqa: E402
from inference.precision import cpu_flags  # noqa: E402
from formats import save_model  # noqa: E402
from inference.embedder import Embedder  # noqa: E402

FULL = {"lstm": {"dim": 4096, "projection_dim": 512, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
                 "use_skip_connections": True},
        "char_cnn": {"embedding": {"dim": 16}, "n_highway": 2, "n_characters": 262, "max_characters_per_token": 50,
                     "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                     "activation": "relu"}}
QUICK = {"lstm": {**FULL["lstm"], "dim": 512, "projection_dim": 128},
         "char_cnn": {**FULL["char_cnn"], "filters": [[1, 32], [2, 32], [3, 64], [4, 128]], "n_highway": 1}}


def bench_sentences(n: int, max_len: int = 50) -> list[list[str]]:
    """The first n sotu sentences, newest speeches first, each cut to ``max_len`` tokens."""
    out = [tokens[:max_len] for _, tokens in itertools.islice(sotu_sentences(newest_first=True), n)]
    if len(out) < n:
        raise RuntimeError(f"only {len(out)} sentences")
    return out


def timed_alternating(runners: dict[str, tuple[Embedder, Callable[[], None]]], sentences: list[list[str]],
                      batch: int, repeats: int) -> dict[str, tuple[float, list[np.ndarray]]]:
    """Best seconds and the vectors per backend; the backends take turns pass by pass, so that the
    machine's drift between passes falls on all of them alike.
    """
    for emb, _ in runners.values():
        emb.embed_sentences(sentences[:batch], batch_size=batch, output="mixed")  # warm-up
    best = {name: (float("inf"), []) for name in runners}
    for _ in range(repeats):
        for name, (emb, before_each) in runners.items():
            before_each()
            t0 = time.perf_counter()
            result = emb.embed_sentences(sentences, batch_size=batch, output="mixed")
            best[name] = min(best[name], (time.perf_counter() - t0, result), key=lambda r: r[0])
    return best


def accuracy(got: list[np.ndarray], want: list[np.ndarray]) -> dict[str, float]:
    a, b = np.concatenate(got).astype(np.float64), np.concatenate(want).astype(np.float64)  # (N, 2P)
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    return {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()), "max_abs": float(np.abs(a - b).max()),
            "tokens_below_0.999": int((cos < 0.999).sum())}


def print_table(figures: dict[str, dict]) -> None:
    base = next(f for name, f in figures.items() if name.startswith("ort_"))["tokens_per_s"]
    print(f"{'backend':<18}{'tokens/s':>10}{'vs torch':>10}{'vs 1st ort':>12}{'min cos':>10}{'mean cos':>10}"
          f"{'max|diff|':>11}{'<0.999':>8}{'MB':>8}")
    for name, f in figures.items():
        print(f"{name:<18}{f['tokens_per_s']:>10.1f}{f['tokens_per_s'] / figures['torch']['tokens_per_s']:>9.2f}x"
              f"{f['tokens_per_s'] / base:>11.2f}x{f.get('min_cosine', 1.0):>10.6f}{f.get('mean_cosine', 1.0):>10.6f}"
              f"{f.get('max_abs', 0.0):>11.2e}{f.get('tokens_below_0.999', 0):>8}{f.get('onnx_mb', 0):>8.0f}")


def matmul_ceiling(shapes: list[tuple[int, int, int]], threads: int, work: Path) -> list[dict]:
    """ONNX Runtime's fp32 MatMul vs its dynamically quantized int8 MatMul alone, at the model's
    shapes (M, K, N): the most int8 can gain over fp32 on this CPU, whatever the graph around it.
    """
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng, rows = np.random.default_rng(0), []
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = threads, 3
    for M, K, N in shapes:
        w = numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "w")
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", N])], [w])
        fp32, int8 = work / f"mm_{K}_{N}.onnx", work / f"mm_{K}_{N}_int8.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(fp32))
        quantize_int8(fp32, int8, bits=weight_bits(cpu_flags()))  # as --precision int8 on this CPU
        x, reps = rng.standard_normal((M, K)).astype(np.float32), max(3, int(2e9 / (M * K * N)))
        sessions = {name: ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
                    for name, path in (("fp32", fp32), ("int8", int8))}
        best = {name: float("inf") for name in sessions}
        for _ in range(5):  # in turns, as the backends above
            for name, sess in sessions.items():
                best[name] = min(best[name], _seconds(lambda: sess.run(None, {"x": x}), reps))
        rates = {name: M * K * N / t / 1e9 for name, t in best.items()}
        rows.append({"M": M, "K": K, "N": N, "fp32_gmac_s": rates["fp32"], "int8_gmac_s": rates["int8"],
                     "ratio": rates["int8"] / rates["fp32"]})
        print(f"MatMul M={M:<4} K={K:<5} N={N:<6} fp32 {rates['fp32']:6.1f}  int8 {rates['int8']:6.1f} GMAC/s  "
              f"int8/fp32 {rates['int8'] / rates['fp32']:.2f}x")
    return rows


def _seconds(fn: Callable[[], object], reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small architecture, 32 sentences")
    ap.add_argument("--sentences", type=int, help="number of sentences (default 512, quick 32)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="timed passes per backend, taken in turns; best kept")
    ap.add_argument("--variants", default="fp32,fp32+dedup,int8+dedup,fp16+dedup",
                    help="precision[+dedup] per ONNX export; +dedup: the char-CNN once per distinct token "
                         "(--token-dedup, ONNX Runtime only); the first variant is the ratio's baseline")
    ap.add_argument("--json-out", help="write the figures here")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the fp32-vs-int8 MatMul ceiling at the model's shapes")
    return ap.parse_args()


def export_variants(model_dir: Path, work: Path, variants: list[str], threads: int) -> dict[str, dict]:
    """One validated export per variant. Returns {variant: figures of the export}."""
    out = {}
    for variant in variants:
        precision, dedup = variant.split("+")[0], variant.endswith("+dedup")
        t0 = time.perf_counter()
        m = export_onnx(model_dir, work / variant, precision=precision, threads=threads,
                        shapes=((1, 1), (3, 8), (17, 33)), token_dedup=dedup)
        out[variant] = {"export_seconds": time.perf_counter() - t0, "onnx_mb": m["onnx"]["bytes"] / 1e6,
                        "export_parity": {k: m["parity"][k] for k in ("max_abs", "min_cosine")}}
    return out


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    options = QUICK if args.quick else FULL
    sentences = bench_sentences(args.sentences or (32 if args.quick else 512))
    n_tokens = sum(map(len, sentences))
    work = Path(tempfile.mkdtemp(prefix="bench_onnx_"))
    model_dir = work / "model"
    save_model(init_bilm(BiLM(ElmoConfig.from_dict(options)), seed=0), model_dir)
    print(f"architecture {'quick' if args.quick else 'full-size'}: LSTM {options['lstm']['dim']}, projection "
          f"{options['lstm']['projection_dim']}; {len(sentences)} sotu sentences, {n_tokens} tokens; "
          f"batch {args.batch_size}; {args.threads} threads")
    variants = [v for v in args.variants.split(",") if v]
    exports = export_variants(model_dir, work, variants, args.threads)
    with contextlib.ExitStack() as stack:
        emb = stack.enter_context(Embedder.from_files(model_dir, threads=args.threads))
        # "torch": each timed pass starts with an empty token cache, as a first pass over new text
        # does (the cache still serves repeats within the pass); "torch_warm": the cache already
        # holds every token, which only repeated text gives.
        runners = {"torch": (emb, emb.backend.fast.token_cache.clear), "torch_warm": (emb, lambda: None)}
        for v in variants:
            runners[f"ort_{v}"] = (stack.enter_context(Embedder.from_onnx(work / v, threads=args.threads)), lambda: None)
        results = timed_alternating(runners, sentences, args.batch_size, args.repeats)
    ref = results["torch"][1]
    figures: dict[str, dict] = {}
    for name, (seconds, got) in results.items():
        figures[name] = {"seconds": seconds, "tokens_per_s": n_tokens / seconds, **exports.get(name[4:], {}),
                         **({} if name.startswith("torch") else accuracy(got, ref))}
    print_table(figures)
    if not args.no_ceiling:
        lstm, cc = options["lstm"], options["char_cnn"]
        C, P, F = lstm["dim"], lstm["projection_dim"], sum(n for _, n in cc["filters"])
        figures["matmul_ceiling"] = matmul_ceiling(  # recurrent step, cell projection, input product, highway
            [(args.batch_size, P, 4 * C), (args.batch_size, C, P), (20 * args.batch_size, P, 4 * C), (512, F, 2 * F)],
            args.threads, work)
    print("bf16: not run (ONNX Runtime's CPU provider has no bf16 MatMul; the bf16 graph is for TensorRT/GPU)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
