"""The host's time a training step, on a CPU: what a host-bound GPU step pays before its kernels run.

On an H200 a training step of the published config keeps the GPU busy 15 % of its 170 ms
(bench/results/gpu_check-2026-11-27-h200.md): the host bounds it. This times ``Trainer.train_step``
on the CPU with the published structure (2 layers, 20 steps unrolled, 7 char-CNN filters, 2 highway
layers, sampled softmax) at negligible widths (LSTM 16 / 8, 2 filters each, 64 negatives, batch
8), so that the step's arithmetic is ~0 and what is left is the host's work: Python, dispatch, and
each kernel's call. Variants, each in its own process, taking turns, the median step of each:

  fused    the recurrence's fused steps as CUDA runs them (``elmo_core.fused_sequence``: four
           compiled kernels a step, ~160 compiled calls a training step), here by inductor's C++ backend
  unfused  the eager recurrence (``elmo_core.lstm_sequence``)

    python bench/bench_train_host.py [--turns 3] [--steps 20]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import elmo_core  # noqa: E402,F401  before torch: the environment torch reads when it loads
from bench.workers import run_worker  # noqa: E402

VARIANTS = ("fused", "unfused")


def negligible_widths() -> dict:
    """The published config's structure, its widths cut to nearly nothing."""
    from bench.bench_softmax_vocab import PUBLISHED

    o = json.loads(json.dumps(PUBLISHED))
    o["lstm"].update(dim=16, projection_dim=8)
    o["char_cnn"]["filters"] = [[w, 2] for w, _ in o["char_cnn"]["filters"]]
    o["char_cnn"]["embedding"]["dim"] = 2
    o.update(n_negative_samples_batch=64, batch_size=8)
    return o


def worker(work: Path, variant: str, steps: int) -> dict:
    """Median seconds a step of ``variant`` after warm-up (a step that compiles a new variant of
    the kernels is the slowest, not the median)."""
    import torch

    from bench.bench_gpu_train import StepTimer, write_train_inputs
    from training.trainer import Trainer, TrainOptions

    torch.set_num_threads(1)
    inputs = write_train_inputs(work, negligible_widths())
    opts = TrainOptions(train=str(inputs / "train.txt"), options=str(inputs / "options.json"),
                        out=str(work / f"run-{variant}"), vocab=str(inputs / "vocab-20000.txt"), batch_size=8,
                        max_steps=10_000, checkpoint_every=0, shuffle_buffer=0, device="cpu", threads=1,
                        compile=variant == "fused")
    trainer = Trainer(opts, log=lambda s: None)
    batches = [trainer.batcher.next_batch() for _ in range(steps + 5)]
    run = StepTimer(trainer, cuda=False)
    run(batches[:5])  # warm-up: the kernels compiled
    run(batches[5:])
    return {"variant": variant, "median_step_ms": statistics.median(run.last) * 1e3,
            "slowest_step_ms": max(run.last) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--worker", nargs=2, metavar=("WORK", "VARIANT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(Path(a.worker[0]), a.worker[1], a.steps)))
        return
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for turn in range(a.turns):
            for name in VARIANTS:
                cmd = [sys.executable, __file__, "--worker", str(Path(tmp) / name), name, "--steps", str(a.steps)]
                res = run_worker(cmd, name)
                print(f"turn {turn + 1}: {name:<8} median step {res['median_step_ms']:.1f} ms "
                      f"(slowest {res['slowest_step_ms']:.0f} ms)", flush=True)
                best[name] = min(best.get(name, float("inf")), res["median_step_ms"])
    print(f"host time a step (best median): fused {best['fused']:.1f} ms, unfused {best['unfused']:.1f} ms = "
          f"{best['fused'] / best['unfused']:.2f}x")


if __name__ == "__main__":
    main()
