"""A training step queues its work without waiting for the device: at most one host wait a step
(bench/train_waits.py's count on the CPU of what makes a CUDA host wait; the metrics' read every
--log-every steps is the only one)."""
from __future__ import annotations

from pathlib import Path

from bench.train_waits import count


def test_a_training_step_makes_the_host_wait_at_most_once(tmp_path: Path) -> None:
    waits = count(tmp_path, steps=10, log_every=5)
    assert waits["per_step"] <= 1, waits["by_op"]
    assert waits["per_step"] > 0, "the metrics are read every --log-every steps"
