"""The biLM's directions on threads of their own (``inference.directions``) against one team of threads,
for each CPU layout and precision, on a quiet machine and beside a neighbour that keeps one core busy.

Full-size published architecture (``--model``: another model directory's architecture, e.g. the
shipped ``models/default``, whose small matrices run plain batched products), random weights; the
recurrence alone (every layer, both directions, mixed: ``FastInference.combine`` on
``inference.layout.recurrence_sample``, what ``--layout auto`` times) on ``--sentences`` sentences
of ``--lengths`` tokens. Every (layout, split or one team) runs once a turn, in turns, so drifting
load falls on all alike; prints the best and the median turn of each, and split / one team. Run on the
threads users get (the project imported before torch: ``OMP_WAIT_POLICY=PASSIVE``).

  python bench/bench_directions.py [--threads 2] [--precisions fp32,bf16] [--layouts packed,fused,rows:64]
                                   [--turns 6] [--busy both|quiet|busy] [--model DIR]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_bilm import FULL_SIZE  # noqa: E402
import torch  # noqa: E402
from elmo_core import BiLM, ElmoConfig  # noqa: E402
from elmo_core.init import init_bilm  # noqa: E402
from inference.fast_path import FastInference  # noqa: E402
from inference.layout import recurrence_sample  # noqa: E402
from inference.row_shape import RowShape  # noqa: E402

BUSY = "while True: pass"


def measure(model: BiLM, precision: str, layouts: list[str], a: argparse.Namespace) -> dict[tuple[str, bool], list[float]]:
    """Tokens/s of each (layout, split) in every turn."""
    low, high = (int(v) for v in a.lengths.split(","))
    x, lengths, weights, tokens = recurrence_sample(model.config, a.sentences, (low, high))
    runs = {}
    for name in layouts:
        layout, _, rows = name.partition(":")
        for split in (False, True):
            fast = FastInference(model, precision, layout=layout, capture=False, rows=RowShape(int(rows or 1024)),
                                 directions=split)
            with fast.running():
                fast.combine(x, lengths, weights)  # packs the weights, compiles the kernels
            runs[(name, split)] = fast
    turns: dict[tuple[str, bool], list[float]] = {k: [] for k in runs}
    for _ in range(a.turns):
        for key, fast in runs.items():
            t0 = time.perf_counter()
            with fast.running():
                fast.combine(x, lengths, weights)
            turns[key].append(tokens / (time.perf_counter() - t0))
    return turns


def report(condition: str, precision: str, turns: dict[tuple[str, bool], list[float]]) -> None:
    for name in dict.fromkeys(k[0] for k in turns):
        team, split = turns[(name, False)], turns[(name, True)]
        best, med = (max(team), max(split)), (statistics.median(team), statistics.median(split))
        print(f"{condition} {precision} {name:9s}: best one team {best[0]:7,.0f} split {best[1]:7,.0f} "
              f"({best[1] / best[0]:.2f}x); median {med[0]:7,.0f} split {med[1]:7,.0f} ({med[1] / med[0]:.2f}x) "
              f"tokens/s of the recurrence", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--layouts", default="packed,fused,rows:64")
    ap.add_argument("--lengths", default="20,30", help="tokens a sentence, low,high")
    ap.add_argument("--sentences", type=int, default=128)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--busy", choices=("both", "quiet", "busy"), default="both")
    ap.add_argument("--model", type=Path, help="a model directory whose architecture is timed (default: full size)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    options = json.loads((a.model / "options.json").read_text()) if a.model else FULL_SIZE
    model = init_bilm(BiLM(ElmoConfig.from_dict(options)), seed=0).eval()
    conditions = ["quiet", "busy"] if a.busy == "both" else [a.busy]
    for condition in conditions:
        neighbour = subprocess.Popen([sys.executable, "-c", BUSY]) if condition == "busy" else None
        try:
            for precision in a.precisions.split(","):
                report(condition, precision, measure(model, precision, a.layouts.split(","), a))
        finally:
            if neighbour is not None:
                neighbour.kill()
                neighbour.wait()


if __name__ == "__main__":
    main()
