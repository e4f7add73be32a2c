"""A run's progress and its limits: when to stop, how far along the lr horizon, the log line; the
sums the steps add up on the device between two reads (``DeviceTotals``); ``MetricLogger``: each
record in RUN_DIR/metrics.jsonl and as TensorBoard scalars in RUN_DIR/tensorboard (the
``tensorboard`` extra; ``tensorboard --logdir RUN_DIR`` shows the curves), by the main rank only.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from storage.atomic import write_text_atomic

TENSORBOARD_DIR = "tensorboard"


@dataclass
class Progress:
    step: int = 0
    tokens: int = 0  # over all ranks
    elapsed: float = 0.0  # seconds of training before this process started
    nll: list[float] = field(default_factory=lambda: [0.0, 0.0])  # since the last log line
    nll_tokens: int = 0


@dataclass(frozen=True)
class Limits:
    """The run's limits (the first reached stops it); None: no such limit. ``minutes`` counts the
    run's training time over resumes, as ``tokens`` and ``steps`` count its progress."""

    tokens: int | None = None
    steps: int | None = None
    minutes: float | None = None

    def reached(self, p: Progress, elapsed: float) -> bool:
        return ((self.steps is not None and p.step >= self.steps)
                or (self.tokens is not None and p.tokens >= self.tokens)
                or (self.minutes is not None and elapsed / 60 >= self.minutes))

    def done(self, p: Progress, elapsed: float) -> float | None:
        """The fraction of the nearest limit reached (None without a limit)."""
        fractions = [p.tokens / self.tokens] if self.tokens else []
        fractions += [p.step / self.steps] if self.steps else []
        fractions += [elapsed / (self.minutes * 60)] if self.minutes else []
        return max(fractions) if fractions else None

    def eta(self, p: Progress, elapsed: float, tokens_per_s: float, s_per_step: float | None) -> float | None:
        """Seconds to the nearest limit at the current rates (None: unknown)."""
        etas = [self.minutes * 60 - elapsed] if self.minutes is not None else []
        etas += [(self.tokens - p.tokens) / tokens_per_s] if self.tokens is not None and tokens_per_s > 0 else []
        etas += [(self.steps - p.step) * s_per_step] if self.steps is not None and s_per_step is not None else []
        return min(etas) if etas else None


def clock(seconds: float | None) -> str:
    return "?" if seconds is None else time.strftime("%H:%M:%S", time.gmtime(max(seconds, 0)))


def log_line(p: Progress, rate: float, eta: float | None, softmax: str) -> str:
    """The progress line. Its loss and perplexity are the training objective's on the batches since
    the last line (dropout on; the ``sampled`` softmax's are not the model's perplexity): the
    evaluations' lines give the full-softmax, stateless figures."""
    f, b = (x / max(p.nll_tokens, 1) for x in p.nll)
    return (f"step {p.step:>7}  tokens {p.tokens:>11,}  {rate:>8,.0f} tok/s  loss {0.5 * (f + b):.4f}  "
            f"ppl fwd {math.exp(min(f, 50)):.1f} bwd {math.exp(min(b, 50)):.1f} ({softmax} softmax)  "
            f"ETA {clock(eta)}")


@dataclass
class DeviceTotals:
    """What the steps add up on the device between two reads: NLL sums (2,), the gradient norms'
    sum and whether every loss was finite (0-d)."""

    nll: torch.Tensor
    grad_norm: torch.Tensor
    finite: torch.Tensor
    steps: int = 0

    @classmethod
    def zeros(cls, device: torch.device) -> "DeviceTotals":
        return cls(torch.zeros(2, device=device), torch.zeros((), device=device),
                   torch.ones((), dtype=torch.bool, device=device))


class MetricLogger:
    """metrics.jsonl and TensorBoard's event files (opened at the first record: a run refused before
    it records anything leaves no empty event file)."""

    def __init__(self, out: Path, enabled: bool, tensorboard: bool, log: Callable[[str], None]) -> None:
        self.path, self.enabled = out / "metrics.jsonl", enabled
        self.writer, self._open_writer = None, None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log("TensorBoard is not installed (pip install 'elmo-pipeline[tensorboard]'): the metrics go to "
                    "metrics.jsonl only")
            else:
                self._open_writer = lambda: SummaryWriter(str(out / TENSORBOARD_DIR))

    def record(self, group: str, step: int, scalars: dict[str, float], extra: dict | None = None) -> None:
        """One record: ``{"step": step, group_name: value, ..., **extra}`` in metrics.jsonl and each
        finite scalar as the TensorBoard scalar ``group/name`` at ``step``."""
        if not self.enabled:
            return
        row = {"step": step, **{f"{group}_{k}": v for k, v in scalars.items()}, **(extra or {})}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self.writer is None and self._open_writer is not None:
            self.writer = self._open_writer()
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(f"{group}/{name}", float(value), step)
            self.writer.flush()

    def drop_after(self, step: int) -> None:
        """Forget the records of steps after ``step`` (a resume's checkpoint): the run writes them
        again, each step once in metrics.jsonl."""
        if not (self.enabled and self.path.is_file()):
            return
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if _step_of(line) <= step]
        if len(kept) != len(lines):
            write_text_atomic(self.path, "".join(kept))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _step_of(line: str) -> float:
    """A metrics.jsonl record's step; a line that is not one (cut by a kill) counts as after every step."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return math.inf
    return step if isinstance(step, int) else math.inf
