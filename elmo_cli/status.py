"""What a long command tells its user before its work shows: one line on stderr per step (loading,
building the vocabulary, warming up), the model's run (``inference.model_run``) among them, naming its
threads and why."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.model_run import ModelRun


def say(command: str, text: str) -> None:
    print(f"elmo {command}: {text}", file=sys.stderr, flush=True)


def say_loading(command: str, run: "ModelRun") -> None:
    """``elmo COMMAND: loading the model M (backend on device, precision: why; N threads: why)``, once."""
    say(command, f"loading the model {run.describe()}")
