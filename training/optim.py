"""Optimizer recipes and the learning-rate schedule of ``elmo train``.

A recipe is the optimizer, its learning rate and schedule, and the batching; flags given explicitly override its
fields. ``default`` was chosen by measurement (docs/training.md, bench/bench_defaults.py):
Adam with a short warm-up and a cosine decay over the run's limit (``--max-minutes``,
``--max-tokens`` or ``--max-steps``, whichever is nearest), which learns several times faster on
short runs than the original's. ``bilm-tf`` is the original's: Adagrad 0.2 with initial
accumulator 1.0 and a constant rate, the LSTM state carried across sentences (``stateful``).
``default`` batches ``packed`` rows whose state resets at every sentence start (training.segments).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .errors import TrainingError

if TYPE_CHECKING:  # a recipe is chosen and checked without the model code (``TrainOptions``)
    import torch
    from torch import nn

OPTIMIZERS = ("adagrad", "adam")
LR_DECAYS = ("none", "linear", "cosine")
BATCHINGS = ("packed", "stateful", "sentences")  # training.data: how rows are made and the state carried


@dataclass(frozen=True)
class Recipe:
    """The optimizer and its schedule. The lr warms up linearly over ``warmup_steps`` steps, then
    decays (``lr_decay``) to ``lr * lr_final`` at the end of the run's horizon."""

    optimizer: str
    lr: float
    warmup_steps: int = 0
    lr_decay: str = "none"
    lr_final: float = 0.1
    batching: str = "packed"

    def __post_init__(self) -> None:
        for name, value, choices in (("optimizer", self.optimizer, OPTIMIZERS), ("--lr-decay", self.lr_decay, LR_DECAYS),
                                     ("--batching", self.batching, BATCHINGS)):
            if value not in choices:
                raise TrainingError(f"unknown {name} {value!r}; use one of {choices}")
        if not self.lr >= 0 or self.warmup_steps < 0 or not 0 <= self.lr_final <= 1:
            raise TrainingError(f"invalid schedule: lr {self.lr} (>= 0), warm-up {self.warmup_steps} steps (>= 0), "
                                f"lr_final {self.lr_final} (0..1)")

    def lr_at(self, step: int, done: float | None) -> float:
        """The lr of step ``step`` (0-based), ``done`` the fraction of the horizon trained (None:
        no horizon, so no decay)."""
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        if self.lr_decay == "none" or done is None:
            return self.lr * warm
        done = min(max(done, 0.0), 1.0)
        shape = 1.0 - done if self.lr_decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
        return self.lr * warm * (self.lr_final + (1.0 - self.lr_final) * shape)

    def build(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        import torch

        if self.optimizer == "adam":  # one fused kernel updates every parameter, its step count on the device
            return torch.optim.Adam(params, lr=self.lr, fused=bool(params))
        return torch.optim.Adagrad(params, lr=self.lr, initial_accumulator_value=1.0)


RECIPES = {
    "default": Recipe("adam", 0.005, warmup_steps=20, lr_decay="cosine", lr_final=0.1),
    "bilm-tf": Recipe("adagrad", 0.2, batching="stateful"),
}


def resolve(name: str, optimizer: str | None = None, lr: float | None = None, warmup_steps: int | None = None,
            lr_decay: str | None = None, lr_final: float | None = None, batching: str | None = None) -> Recipe:
    """The recipe ``name`` with the given fields overridden. Changing the optimizer alone keeps
    that optimizer's usual lr (Adam 1e-3, Adagrad 0.2) unless ``lr`` is given too."""
    if name not in RECIPES:
        raise TrainingError(f"unknown --recipe {name!r}; use one of {tuple(RECIPES)}")
    base = RECIPES[name]
    if optimizer is not None and optimizer != base.optimizer and lr is None:
        lr = 1e-3 if optimizer == "adam" else 0.2
    given = {"optimizer": optimizer, "lr": lr, "warmup_steps": warmup_steps, "lr_decay": lr_decay, "lr_final": lr_final,
             "batching": batching}
    return replace(base, **{k: v for k, v in given.items() if v is not None})
