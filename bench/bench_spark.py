"""``elmo embed --engine spark --spark-master local[2]`` against the local runner on the same corpus
and model, taking turns, each job a process of its own as a user runs it, for each corpus size
(default 3,000 and 20,000 rows); shards as each engine sizes them unless ``--rows-per-shard``.

The local runner runs the model on 2 threads; Spark runs 2 tasks at once, each on 1 thread (its
default). Printed per turn and as the best of each: tokens/s of the whole command (Spark's start
included), tokens/s once Spark is up (the manifest's ``this_run.seconds``: the session starts as the
job is planned, before it; ``engine.session_s`` says how long that took), the ratio to
the local runner (target >= 0.85x), and how many times each Spark Python worker loaded the model
(target 1).

    python bench/bench_spark.py [--rows 3000,20000] [--repeats 2] [--model models/default]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "elmo_cli", *args, "--quiet", "--json"], capture_output=True,
                       text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"elmo {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="3000,20000", help="comma-separated corpus sizes")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default=str(ROOT / "models" / "default"))
    ap.add_argument("--rows-per-shard", type=int, default=None, help="default: as each engine sizes them")
    a = ap.parse_args()
    for rows in (int(r) for r in a.rows.split(",")):
        bench(rows, a)


def bench(rows: int, a: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench_spark_"))
    corpus = work / "corpus"
    subprocess.run([sys.executable, "-m", "elmo_cli", "sample-corpus", "--out", str(corpus), "--rows", str(rows),
                    "--files", "4"], check=True, cwd=ROOT, capture_output=True)
    common = ["--model", a.model, "--id-column", "id"]
    common += ["--rows-per-shard", str(a.rows_per_shard)] if a.rows_per_shard else []
    runs = {"local": ["--threads", "2"], "spark": ["--engine", "spark", "--spark-master", "local[2]"]}
    best: dict[str, dict] = {}
    for turn in range(a.repeats):
        for name, extra in runs.items():
            m, wall = run(["embed", "--text", str(corpus), "--out", str(work / f"{name}-{turn}"), *common, *extra])
            session = m["engine"].get("session_s", 0.0)
            f = {"tokens": m["tokens"], "wall_tokens_per_s": m["tokens"] / wall,
                 "running_tokens_per_s": m["tokens"] / m["this_run"]["seconds"], "engine": m["engine"]}
            print(f"{rows:,} rows, turn {turn + 1} {name} ({len(m['shards'])} shards): "
                  f"{f['wall_tokens_per_s']:,.0f} tokens/s for the command, "
                  f"{f['running_tokens_per_s']:,.0f} once running"
                  + (f" (Spark's start {session:.1f} s)" if name == "spark" else ""), flush=True)
            if name not in best or f["wall_tokens_per_s"] > best[name]["wall_tokens_per_s"]:
                best[name] = f
    spark, local = best["spark"], best["local"]
    print(f"spark local[2] vs the local runner: {spark['wall_tokens_per_s'] / local['wall_tokens_per_s']:.2f}x for "
          f"the command, {spark['running_tokens_per_s'] / local['running_tokens_per_s']:.2f}x once running "
          f"({spark['tokens']:,} tokens, {rows:,} rows); model loads per Python worker: "
          f"{sorted(set(spark['engine']['model_loads'].values()))} over {spark['engine']['processes']} workers")


if __name__ == "__main__":
    main()
