"""The run's metric logger: the console line, RUN_DIR/metrics.jsonl and TensorBoard event files.

One ``record`` call writes one step's scalars everywhere: a JSON object a line in metrics.jsonl,
and the same scalars as TensorBoard scalars in RUN_DIR/tensorboard (``torch.utils.tensorboard``;
the ``tensorboard`` extra), tagged ``group/name`` (``train/ppl_forward``, ``valid/ppl_mean``, ...),
so ``tensorboard --logdir RUN_DIR`` shows the curves. Only the main data-parallel rank writes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

TENSORBOARD_DIR = "tensorboard"


class MetricLogger:
    def __init__(self, out: Path, enabled: bool, tensorboard: bool, log: Callable[[str], None]) -> None:
        self.path, self.enabled, self.log = out / "metrics.jsonl", enabled, log
        self.writer = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log("TensorBoard is not installed (pip install 'elmo-pipeline[tensorboard]'): the metrics go to "
                    "metrics.jsonl only")
            else:
                self.writer = SummaryWriter(str(out / TENSORBOARD_DIR))

    def record(self, group: str, step: int, scalars: dict[str, float], extra: dict | None = None) -> None:
        """One record: ``{"step": step, group_name: value, ..., **extra}`` in metrics.jsonl and each
        finite scalar as the TensorBoard scalar ``group/name`` at ``step``."""
        if not self.enabled:
            return
        row = {"step": step, **{f"{group}_{k}": v for k, v in scalars.items()}, **(extra or {})}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(f"{group}/{name}", float(value), step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
