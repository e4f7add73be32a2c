"""The recurrence's layouts on this CPU, each precision: what ``--layout auto`` measures, printed.

Full-size published architecture (``--model``: another model directory's), random weights; the
recurrence alone (every layer, both directions, mixed) under each of ``inference.layout.candidates``
(packed, packed on oneDNN products where packed runs plain ones, fused, rows at each of
``CPU_ROW_COUNTS``), taking turns, best of ``--turns``, as ``inference.layout.measure_layouts``
runs it, on ``--sentences`` sentences of ``--lengths`` tokens. Prints tokens/s, each as a ratio to
``packed`` of the same precision and to fp32 ``packed``, and what ``choose`` takes.

  python bench/bench_layouts.py [--threads 2] [--precisions fp32,bf16] [--lengths 20,30] [--turns 4] [--model DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_bilm import FULL_SIZE  # noqa: E402
import torch  # noqa: E402
from elmo_core import ElmoConfig  # noqa: E402
from inference import layout  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--lengths", default="20,30", help="tokens a sentence, low,high (auto measures 10,14)")
    ap.add_argument("--sentences", type=int, default=layout.SAMPLE_SENTENCES)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--model", type=Path, help="a model directory whose architecture is timed (default: full size)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    low, high = (int(v) for v in a.lengths.split(","))
    layout.SAMPLE_SENTENCES, layout.SAMPLE_LENGTHS, layout.SAMPLE_TURNS = a.sentences, (low, high), a.turns
    config = ElmoConfig.from_dict(json.loads((a.model / "options.json").read_text()) if a.model else FULL_SIZE)
    found = {p: layout.measure_layouts(config, p, a.threads) for p in a.precisions.split(",") if p}
    base = found.get("fp32", ({}, 0.0))[0].get("packed")
    for p, (tps, warmup) in found.items():
        cells = [f"{name} {v:,.0f} ({v / tps['packed']:.2f}x packed"
                 + (f", {v / base:.2f}x fp32 packed)" if base else ")") for name, v in tps.items()]
        chosen = layout.choose(tps, warmup)
        print(f"{p}: {'; '.join(cells)}; a compiled layout's warm-up {warmup:.1f} s -> auto takes {chosen.name}"
              + (f" (at most {chosen.rows} rows a step)" if chosen.rows else "")
              + (" (every product on packed oneDNN weights)" if chosen.onednn else ""), flush=True)


if __name__ == "__main__":
    main()
