"""How fast the CLI answers what needs no model: ``elmo --help``, a subcommand's ``--help``, an
argument error, a wrong column. Each line: the best wall time of ``--rounds`` fresh processes.

  python bench/bench_cli.py [--rounds 3] [--model models/default]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def best_wall(argv: list[str], rounds: int) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    best, code = float("inf"), 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        code = subprocess.run([sys.executable, "-m", "elmo_cli", *argv], cwd=ROOT, env=env, capture_output=True).returncode
        best = min(best, time.perf_counter() - t0)
    return best, code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=str(ROOT / "models" / "default"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_cli-"))
    subprocess.run([sys.executable, "-m", "elmo_cli", "sample-corpus", "--out", str(work / "corpus"), "--rows", "20"],
                   cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, capture_output=True)
    cases = {"elmo --help": ["--help"], "elmo --version": ["--version"], "elmo info --help": ["info", "--help"],
             "elmo embed --help": ["embed", "--help"], "elmo info (no --model)": ["info"],
             "elmo embed, a wrong column": ["embed", "--text", str(work / "corpus"), "--out", str(work / "out"), "--model", args.model,
                                            "--text-column", "nope"]}
    for name, argv in cases.items():
        wall, code = best_wall(argv, args.rounds)
        print(f"{name:30s} {wall:6.2f} s  (exit {code}; best of {args.rounds})")


if __name__ == "__main__":
    main()
