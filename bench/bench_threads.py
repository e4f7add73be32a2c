"""Default threads against ``--threads 1``, on a quiet machine and beside a neighbour that keeps one
core busy: does the default use the cores it has (quiet: <= 0.8x the one-thread time) and not
collapse under contention (busy: <= 1.15x the one-thread time)?

Each round runs every candidate once, in turns (quiet, then beside a busy loop), so that drifting
load from other processes falls on all of them alike; the report gives each candidate's median wall
and CPU seconds and its ratio to ``--threads 1`` in the same condition. The job is a real
``elmo embed`` of a sample corpus (the shipped model by default).

  python bench/bench_threads.py [--rows 2000] [--rounds 3] [--model models/default]
      [--candidate "passive=OMP_WAIT_POLICY=PASSIVE"]   # NAME=ENV=VALUE[,ENV=VALUE]: an extra default-threads run
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY = "while True: pass"


def run_job(corpus: Path, model: str, out: Path, threads: int | None, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``elmo embed`` process."""
    cmd = [sys.executable, "-m", "elmo_cli", "embed", "--text", str(corpus), "--out", str(out), "--model", model, "--quiet"]
    cmd += ["--threads", str(threads)] if threads else []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.read()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def candidates(extra: list[str]) -> dict[str, tuple[int | None, dict[str, str]]]:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    found = {"threads 1": (1, base), "default": (None, base)}
    for spec in extra:
        name, _, assignments = spec.partition("=")
        env = dict(base, **dict(a.split("=", 1) for a in assignments.split(",") if a))
        found[name] = (None, env)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=str(ROOT / "models" / "default"))
    ap.add_argument("--candidate", action="append", default=[])
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_threads-"))
    subprocess.run([sys.executable, "-m", "elmo_cli", "sample-corpus", "--out", str(work / "corpus"), "--rows", str(args.rows),
                    "--files", "1"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    runs = candidates(args.candidate)
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for condition in ("quiet", "busy"):
            neighbour = subprocess.Popen([sys.executable, "-c", BUSY]) if condition == "busy" else None
            try:
                for name, (threads, env) in runs.items():
                    out = work / f"out-{r}-{condition}-{name.replace(' ', '_')}"
                    times.setdefault((condition, name), []).append(run_job(work / "corpus", args.model, out, threads, env))
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    report = {}
    for (condition, name), got in times.items():
        wall, cpu = statistics.median(w for w, _ in got), statistics.median(c for _, c in got)
        one = statistics.median(w for w, _ in times[(condition, "threads 1")])
        report.setdefault(condition, {})[name] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                                                  "vs_threads_1": round(wall / one, 3),
                                                  "walls": [round(w, 2) for w, _ in got]}
    print(json.dumps({"rows": args.rows, "model": args.model, "rounds": args.rounds, "cpus": len(os.sched_getaffinity(0)),
                      "load_average": os.getloadavg(), "report": report}, indent=2))


if __name__ == "__main__":
    main()
