"""biLM speed: our torch backend against AllenNLP's ELMo on the same weights and sentences, same run.

Full-size published architecture (elmo_2x4096_512_2048cnn_2xhighway) with random weights written
in the published hdf5 layout; batches of 64 real sentences of 20-30 tokens from the sotu package.
Prints tokens/s (real tokens; boundaries not counted) for both, the ratio, our fraction of the
fp32 bound, and the max difference of our outputs from a straightforward float64 computation.

Then each of ``--precisions`` (torch, default bf16) and ``--onnx-precisions`` (ONNX Runtime, default
fp32,int8: the exports ``elmo embed --backend onnx --precision P`` builds) against torch fp32 on the
same batches, taking turns: tokens/s and the min per-token cosine against torch fp32 over every
layer and the average of the layers; the CPU's bf16 / int8 instruction flags are printed first.

``--model DIR`` (a trained model, e.g. models/default) runs only that comparison on it: every
precision on trained weights, whose int8 export is planned per model (``export.quantize``).

  python bench/bench_bilm.py [--threads 2] [--batches 8] [--peer /tmp/peer-allennlp/bin/python]
                             [--precisions bf16] [--onnx-precisions fp32,int8] [--model models/default]
"""
from __future__ import annotations

import argparse
import functools
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from corpora.sotu import sotu_sentences  # noqa: E402
import torch  # noqa: E402
from elmo_core import BiLM, ElmoConfig, batch_to_ids, tokens_to_char_ids  # noqa: E402
from elmo_core.init import init_bilm  # noqa: E402
from formats import save_model  # noqa: E402
from inference import TorchBackend  # noqa: E402

FULL_SIZE = {
    "lstm": {"use_skip_connections": True, "projection_dim": 512, "cell_clip": 3, "proj_clip": 3,
             "dim": 4096, "n_layers": 2},
    "char_cnn": {"activation": "relu", "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                 "n_highway": 2, "embedding": {"dim": 16}, "n_characters": 262, "max_characters_per_token": 50},
}


def full_size_model(workdir: Path) -> Path:
    model_dir = workdir / "elmo_2x4096_512_2048cnn_2xhighway_random"
    if not (model_dir / "weights.hdf5").is_file():
        print(f"writing random full-size weights to {model_dir} ...", flush=True)
        save_model(init_bilm(BiLM(ElmoConfig.from_dict(FULL_SIZE)), seed=0), model_dir)
    return model_dir


def bench_sentences(n: int) -> list[list[str]]:
    """The first n sentences of 20-30 tokens, newest speeches first (modern English)."""
    out = []
    for _, s in sotu_sentences(newest_first=True, min_tokens=20, max_tokens=30):
        out.append(s)
        if len(out) == n:
            return out
    raise RuntimeError(f"only {len(out)} sentences of 20-30 tokens")


def time_ours(backend: TorchBackend, batches: list[list[list[str]]]) -> tuple[float, list[np.ndarray]]:
    backend.run(batch_to_ids(batches[0]))  # warm-up
    ntok, outs, t0 = 0, [], time.perf_counter()
    for b in batches[1:]:
        layers, _ = backend.run(batch_to_ids(b))
        outs.append(layers)
        ntok += sum(map(len, b))
    return ntok / (time.perf_counter() - t0), outs


def char_ids_rate(sentences: list[list[str]], repeat: int = 20) -> float:
    """Tokens/s of batch_to_ids on one thread (numpy is single-threaded here)."""
    tokens = [t for s in sentences for t in s] * repeat
    t0 = time.perf_counter()
    tokens_to_char_ids(tokens)
    return len(tokens) / (time.perf_counter() - t0)


def run_peer(python: str, model_dir: Path, sent_file: Path, n_batches: int, bs: int, threads: int) -> dict[str, float]:
    script = ROOT.parent / "shared" / "peers" / "allennlp_embed.py"
    cmd = [python, str(script), str(model_dir / "options.json"), str(model_dir / "weights.hdf5"),
           "--sentences", str(sent_file), "--bench", str(n_batches), "--batch-size", str(bs),
           "--threads", str(threads), "--show", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"AllenNLP peer failed:\n{r.stderr[-3000:]}")
    found = dict(re.findall(r"BENCH (\S+):.*-> (\d+) tokens/s", r.stdout))
    return {k: float(v) for k, v in found.items()}


def min_cosine(ref: list[np.ndarray], got: list[np.ndarray], batches: list[list[list[str]]]) -> float:
    """Min per-token cosine over every layer and the layers' average. Shape: per batch (B, L+1, T, D)."""
    worst = 1.0
    for r, g, sents in zip(ref, got, batches):
        mask = np.array([[t < len(s) for t in range(r.shape[2])] for s in sents])  # (B, T)
        for a, b in [(r[:, l], g[:, l]) for l in range(r.shape[1])] + [(r.mean(1), g.mean(1))]:
            a, b = a[mask].astype(np.float64), b[mask].astype(np.float64)  # (N, D)
            cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
            worst = min(worst, float(cos.min()))
    return worst


def compare_precisions(model_dir: Path, batches: list[list[list[str]]], threads: int, precisions: list[str],
                       onnx_precisions: list[str], workdir: Path, layouts: list[str]) -> None:
    """torch fp32 and each other precision in turns, twice, under each of ``layouts`` (packed: the
    fixed CPU path before layouts were measured; fused; ``--layout auto`` picks one of them by its own
    measurement, printed); best tokens/s of each; min cosine against torch fp32 (packed). ONNX ones
    run the export ``elmo embed --backend onnx --precision P`` builds (``export.cache``, under
    ``workdir``; the first run exports and validates)."""
    from inference.precision import BF16_CPU_FLAGS, INT8_CPU_FLAGS, bf16_cpu_warning, cpu_flags
    from export.cache import cached_onnx_export
    from inference.layout import resolve_layout
    from inference.registry import open_backend

    flags = cpu_flags()
    shown = [f for f in BF16_CPU_FLAGS + INT8_CPU_FLAGS + ("avx512f", "avx2") if f in flags]
    print(f"CPU flags: {' '.join(shown) or 'none of the bf16 / int8 ones'}")
    refused = {}
    for p in precisions:
        slow = bf16_cpu_warning(p, "cpu")
        if slow is not None and slow.scalar:  # what `elmo embed --precision p` refuses here: scalar products, hours
            refused[p] = slow.text
            print(f"torch {p}: refused on this CPU, as the CLI refuses it ({slow.text})")
    config = ElmoConfig.from_dict(json_options(model_dir))
    runners, auto = {}, {}
    for p in dict.fromkeys(["fp32", *precisions]):
        if p in refused:
            continue
        chosen = resolve_layout("auto", "cpu", p, config, threads)
        auto[p] = chosen
        print(f"torch {p}: --layout auto takes {chosen.name}{' on oneDNN products' if chosen.onednn else ''} "
              f"({chosen.reason})", flush=True)
        for layout in dict.fromkeys([*layouts, *(["packed:onednn"] if chosen.onednn else [])]):
            name, _, rows = layout.partition(":")  # rows:N, the rows layout at most N rows a step; packed:onednn
            runners[f"torch {p} {layout}"] = TorchBackend.from_files(
                model_dir, threads=threads, precision=p, layout=name, rows=int(rows) if rows.isdigit() else None,
                onednn=rows == "onednn")
    for p in onnx_precisions:
        t0 = time.perf_counter()
        export, built = cached_onnx_export(model_dir, p, threads=threads, root=workdir / "cache")
        if built:
            print(f"onnx {p}: exported and validated in {time.perf_counter() - t0:.0f} s ({export})", flush=True)
        runners[f"onnx {p}"] = open_backend(export, "onnx", threads=threads)
    best: dict[str, float] = {}
    outs: dict[str, list[np.ndarray]] = {}
    fp32_rows, bounds = engine_rows(batches[1:], auto.get("fp32")), {"one product on all threads": 0.0}
    for turn in range(2):
        for name, backend in runners.items():
            tps, outs[name] = time_ours(backend, batches)
            best[name] = max(best.get(name, 0.0), tps)
            print(f"turn {turn + 1}: {name:18s} {tps:8.0f} tokens/s", flush=True)
        for way, bound in fp32_bounds(threads, fp32_rows, config).items():  # the bound in turns with the runs
            bounds[way] = max(bounds.get(way, 0.0), bound)
    base_name = f"torch fp32 {layouts[0]}"
    base = best[base_name]
    for name in list(runners)[1:]:
        print(f"{name}: {best[name]:.0f} tokens/s = {best[name] / base:.2f}x {base_name} ({base:.0f}); min token "
              f"cosine vs it {min_cosine(outs[base_name], outs[name], batches[1:]):.6f} (every layer and the mix)")
    picked = {p: f"rows:{chosen.rows}" if chosen.rows else "packed:onednn" if chosen.onednn else chosen.name
              for p, chosen in auto.items()}  # bench names
    for p in auto:
        tps = {name.removeprefix(f"torch {p} "): v for name, v in best.items() if name.startswith(f"torch {p} ")}
        got, packed = tps.get(picked[p], float("nan")), tps.get("packed", float("nan"))
        print(f"torch {p}: --layout auto ({picked[p]}) {got:.0f} tokens/s vs the fixed packed {packed:.0f} = "
              f"{got / packed:.2f}x (target: never slower)")
    fp32_auto = best.get(f"torch fp32 {picked['fp32']}", base)
    for p in auto:
        if p == "fp32" or f"torch {p} {picked[p]}" not in best:
            continue
        ours = best[f"torch {p} {picked[p]}"] / fp32_auto
        rows = engine_rows(batches[1:], auto[p])
        for m in (rows, GEMM_SHAPE[0]):
            gain = gemm_gain(p, threads, m, config)
            print(f"torch {p} (auto): {ours:.2f}x fp32 (auto) end to end against the {p} products' own {gain:.2f}x "
                  f"at {m} rows ({'what the engine runs here' if m == rows else 'fuller tiles'}; the three LSTM "
                  f"products at their shapes, same run): {ours / gain:.0%} of what the hardware offers (target >= "
                  f"85% at the engine's rows; >= 3x fp32 with AMX)", flush=True)
    way = max(bounds, key=bounds.__getitem__)
    print(f"torch fp32 (auto): {fp32_auto:.0f} tokens/s = {fp32_auto / bounds[way]:.0%} of the fp32 bound of its LSTM "
          f"products alone at the engine's shapes ({fp32_rows} rows: {bounds[way]:.0f} tokens/s, {way}, the best "
          f"of each turn's; " + ", ".join(f"{w} {b:.0f}" for w, b in bounds.items()) + "; the char-CNN on top; "
          f"target >= 85%)", flush=True)
    from inference.fast_lstm import INPUT_CHUNK_ROWS

    m, k, n = INPUT_CHUNK_ROWS, config.lstm.projection_dim, 4 * config.lstm.dim  # the input part's chunk
    print(f"fp32 products at the input part's shape ({m} x {k} @ {k} x {n}, {threads} threads): plain torch.mm (the "
          f"BLAS torch was built with) {product_rate('fp32', threads, m, k, n, plain=True) / 1e9:.0f} GFLOP/s, packed oneDNN weights (what "
          f"the engine runs) {product_rate('fp32', threads, m, k, n) / 1e9:.0f}", flush=True)


def json_options(model_dir: Path) -> dict:
    import json

    return json.loads((model_dir / "options.json").read_text())


def engine_rows(batches: list[list[list[str]]], layout=None) -> int:  # type: ignore[no-untyped-def]
    """The rows a recurrent step of the engine multiplies on these batches, on average over steps:
    the sorted packing's (step t runs the sentences longer than t, boundaries included), or under
    the ``rows`` layout (``layout.name``) the row count each batch takes (``RowShape.for_batch``)."""
    from inference.row_lstm import RowShape

    steps = tokens = 0
    for b in batches:
        lengths = [len(s) + 2 for s in b]
        if layout is not None and layout.name == "rows":
            shape = RowShape(layout.rows or RowShape().rows).for_batch(lengths)
            windows = math.ceil(max(max(lengths), math.ceil(sum(lengths) / shape.rows)) / shape.steps)
            steps, tokens = steps + windows * shape.steps, tokens + windows * shape.steps * shape.rows
            continue
        steps += max(lengths)
        tokens += sum(lengths)
    return max(1, round(tokens / steps))


# The LSTM's recurrent product at full size: rows x P=512 @ 512 x 4C=16384 (256: a batch's two
# directions of 128 rows, a fuller AMX tile).
GEMM_SHAPE = (256, 512, 16384)


def product_rate(precision: str, threads: int, m: int, k: int, n: int, turns: int = 3, plain: bool = False) -> float:
    """FLOP/s of ``m`` x ``k`` @ ``k`` x ``n`` on oneDNN's packed weights, as the engine runs its
    products, best of ``turns``; ``plain``: by ``torch.mm`` instead (the BLAS torch was built with:
    MKL, whose fp32 kernels on AMD CPUs with AVX-512 are its AVX2 ones)."""
    from elmo_core.kinds import Precision
    from inference.packed_gemm import PackedLinear

    torch.set_num_threads(threads)
    low = Precision.of(precision).torch
    x, w = torch.randn(m, k).to(low), (torch.randn(k, n) / k ** 0.5).to(low)
    product = (lambda: torch.mm(x, w)) if plain else functools.partial(PackedLinear(w, m), x)
    return 2 * m * k * n / best_seconds(product, turns, reps=4)


def best_seconds(fn: Callable[[], object], turns: int, reps: int) -> float:
    """Seconds a call of ``fn`` takes: one call to warm up (oneDNN's primitive, a compiled variant),
    then the best of ``turns`` turns of ``reps`` calls each."""
    fn()
    best = float("inf")
    for _ in range(turns):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def lstm_bound(precision: str, threads: int, rows: int, config: ElmoConfig) -> float:
    """Tokens/s of the biLSTM's products alone at the shapes the engine runs them: the input part
    at ``INPUT_CHUNK_ROWS`` rows, the recurrent and projection products at ``rows``."""
    from inference.fast_lstm import INPUT_CHUNK_ROWS

    P, C = config.lstm.projection_dim, config.lstm.dim
    shapes = [(INPUT_CHUNK_ROWS, P, 4 * C), (rows, P, 4 * C), (rows, C, P)]
    seconds = sum(2 * k * n / product_rate(precision, threads, m, k, n) for m, k, n in shapes)  # a token, a direction
    return 1 / (seconds * 2 * config.lstm.n_layers)


def fp32_bounds(threads: int, rows: int, config: ElmoConfig) -> dict[str, float]:
    """The biLSTM's fp32 products alone at the engine's shapes, run two ways: each product on all
    ``threads`` (``lstm_bound``), and, where the engine runs its directions on threads of their own
    (``inference.directions.split``), each direction's products on its own thread, both at once."""
    from inference.directions import split

    bounds = {"one product on all threads": lstm_bound("fp32", threads, rows, config)}
    if split(threads):
        bounds["each direction on its own threads, both at once"] = split_lstm_bound(threads, rows, config)
    return bounds


def split_lstm_bound(threads: int, rows: int, config: ElmoConfig, turns: int = 3) -> float:
    """``lstm_bound`` in fp32 as the engine splits the work: each direction's products (weights of
    its own) on a thread of half the ``threads``, both directions at once (``DirectionThreads``)."""
    from inference.directions import DirectionThreads
    from inference.fast_lstm import INPUT_CHUNK_ROWS
    from inference.packed_gemm import PackedLinear

    torch.set_num_threads(threads)
    P, C = config.lstm.projection_dim, config.lstm.dim
    directions, seconds = DirectionThreads(), 0.0
    for m, k, n in [(INPUT_CHUNK_ROWS, P, 4 * C), (rows, P, 4 * C), (rows, C, P)]:
        work = [(torch.randn(m, k), PackedLinear(torch.randn(k, n) / k ** 0.5, m)) for _ in (0, 1)]
        run = lambda d: [work[d][1](work[d][0]) for _ in range(4)]  # noqa: E731
        directions.run(run)  # warm-up: each thread's primitives
        best = float("inf")
        for _ in range(turns):
            t0 = time.perf_counter()
            directions.run(run)
            best = min(best, (time.perf_counter() - t0) / 4)
        seconds += best / m  # a token of both directions, at once
    return 1 / (seconds * config.lstm.n_layers)


def gemm_gain(precision: str, threads: int, rows: int, config: ElmoConfig, turns: int = 2) -> float:
    """The biLSTM's products in ``precision`` over fp32 at the engine's shapes (``lstm_bound``), in turns."""
    bounds = {"fp32": 0.0, precision: 0.0}
    for _ in range(turns):
        for name in bounds:
            bounds[name] = max(bounds[name], lstm_bound(name, threads, rows, config))
    return bounds[precision] / bounds["fp32"]


def fp32_peak(threads: int, n: int = 2048) -> float:
    """FLOP/s of one large fp32 matrix product on ``threads`` threads, the best of 5: this CPU's fp32 bound."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def check_against_reference(model_dir: Path, sentences: list[list[str]], ours: np.ndarray) -> float:
    """Max |ours - float64 straightforward| over every layer of the given sentences."""
    sys.path.insert(0, str(ROOT))
    from tests.reference_impl import ReferenceElmo

    ref = ReferenceElmo(FULL_SIZE, str(model_dir / "weights.hdf5"))
    return max((float(np.abs(ours[i, :, : len(s)] - ref.layers(s)).max()) for i, s in enumerate(sentences)), default=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=128, help="sentences a batch (the engine's default 4,096-token "
                                                                 "batches hold about 128 of these)")
    ap.add_argument("--peer", default="/tmp/peer-allennlp/bin/python", help="python of the AllenNLP venv ('' to skip)")
    ap.add_argument("--check", type=int, default=4, help="sentences checked against the float64 reference")
    ap.add_argument("--workdir", type=Path, default=ROOT / ".cache" / "bench")
    ap.add_argument("--precisions", default="bf16", help="torch precisions compared with fp32 ('' for none)")
    ap.add_argument("--onnx-precisions", default="fp32,int8", help="ONNX Runtime exports compared with torch fp32 "
                                                                   "('' for none)")
    ap.add_argument("--model", type=Path, default=None, help="a trained model directory: only the precisions, on it")
    ap.add_argument("--layouts", default="packed,fused,rows:64,rows:1024",
                    help="torch layouts compared (inference/layout.py; rows:N at most N rows a step; packed:onednn "
                         "every product on packed oneDNN weights, added where auto takes it; the first is the baseline)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    a.workdir.mkdir(parents=True, exist_ok=True)
    sents = bench_sentences((a.batches + 1) * a.batch_size)
    batches = [sents[i * a.batch_size : (i + 1) * a.batch_size] for i in range(a.batches + 1)]
    if a.model is not None:
        print(f"{a.model}: {a.batches} batches x {a.batch_size} sentences, threads={a.threads}")
        compare_precisions(a.model, batches, a.threads, [p for p in a.precisions.split(",") if p],
                           [p for p in a.onnx_precisions.split(",") if p], a.workdir, a.layouts.split(","))
        return
    model_dir = full_size_model(a.workdir)
    sent_file = a.workdir / "bench_sentences.txt"
    sent_file.write_text("\n".join(" ".join(s) for s in sents) + "\n", encoding="utf-8")
    cfg = ElmoConfig.from_dict(FULL_SIZE)
    peak = fp32_peak(a.threads)
    bound = peak / cfg.flops_per_token
    print(f"full-size biLM, {a.batches} batches x {a.batch_size} sentences "
          f"({sum(map(len, sents[a.batch_size:])) / (a.batches * a.batch_size):.1f} tokens/sentence), "
          f"threads={a.threads}, {cfg.flops_per_token / 1e6:.0f} MFLOP/token, fp32 bound {bound:.0f} tokens/s "
          f"(a 2048^3 fp32 product runs at {peak / 1e9:.0f} GFLOP/s here)")
    print(f"character ids: {char_ids_rate(sents) / 1e6:.2f}M tokens/s on one core (target >= 1M)")
    backend = TorchBackend.from_files(model_dir, threads=a.threads)
    ours, outs = time_ours(backend, batches)
    print(f"ours (torch fp32), run 1: {ours:8.0f} tokens/s  ({ours / bound:.0%} of the fp32 bound)", flush=True)
    err = check_against_reference(model_dir, batches[1][: a.check], outs[0])
    print(f"max |ours - float64 straightforward| over all layers of {a.check} sentences: {err:.2e} (target <= 1e-5)")
    if a.precisions or a.onnx_precisions:
        compare_precisions(model_dir, batches, a.threads, [p for p in a.precisions.split(",") if p],
                           [p for p in a.onnx_precisions.split(",") if p], a.workdir, a.layouts.split(","))
    if not (a.peer and Path(a.peer).exists()):
        print(f"AllenNLP peer not found at {a.peer!r}: run ../shared/peers/setup_allennlp.sh")
        return
    peer = run_peer(a.peer, model_dir, sent_file, a.batches, a.batch_size, a.threads)
    backend.fast.token_cache.clear()  # cold again, as in run 1
    again, _ = time_ours(backend, batches)  # after the peer too, so drift on the machine shows
    mean = (ours + again) / 2
    print(f"ours (torch fp32), run 2: {again:8.0f} tokens/s; mean {mean:.0f} ({mean / bound:.0%} of the fp32 bound)")
    for name, tps in peer.items():
        print(f"AllenNLP {name:14s} {tps:8.0f} tokens/s   ours (mean) / AllenNLP = {mean / tps:.2f}x (target >= 2x)")

if __name__ == "__main__":
    main()
