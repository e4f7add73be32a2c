"""A run's progress and its limits: when to stop, how far along the lr horizon, the log line."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch


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


class DeviceTotals:
    """What training steps leave on the device between two reads: the per-direction NLL sums,
    each step's gradient norm, and the first step whose loss was not finite. Adding waits for
    nothing; ``read`` copies it all to the host at once and starts anew."""

    def __init__(self) -> None:
        self.sums: torch.Tensor | None = None  # (2,) float64
        self.grad_norms: list[torch.Tensor] = []
        self.bad: torch.Tensor | None = None  # () int64: the first non-finite step, or 0

    def add_sums(self, sums: torch.Tensor) -> None:
        s = sums.detach().double()
        self.sums = s if self.sums is None else self.sums + s

    def add_loss(self, loss: torch.Tensor, step: int) -> None:
        here = torch.where(torch.isfinite(loss), 0, step)  # () int64 on the loss's device
        self.bad = here if self.bad is None else torch.where(self.bad > 0, self.bad, here)

    def read(self) -> tuple[torch.Tensor, float, int | None]:
        """(the NLL sums (2,) float64 on the host, the mean gradient norm, the first non-finite step or None)."""
        if self.sums is None:
            return torch.zeros(2, dtype=torch.float64), 0.0, None
        dev = self.sums.device
        grads = torch.stack(self.grad_norms).double().mean().reshape(1) if self.grad_norms else \
            torch.zeros(1, dtype=torch.float64, device=dev)
        bad = (self.bad if self.bad is not None else torch.zeros((), dtype=torch.long, device=dev)).double().reshape(1)
        host = torch.cat([self.sums, grads.to(dev), bad.to(dev)]).cpu()  # (4,): one copy
        self.__init__()  # type: ignore[misc]
        return host[:2], float(host[2]), (int(host[3]) or None)
