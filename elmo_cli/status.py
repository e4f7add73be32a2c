"""What a long command tells its user before its work shows: one line on stderr per step (loading,
building the vocabulary, warming up), the first of them naming its threads and why
(``runtime.cpus``)."""
from __future__ import annotations

import sys

from runtime import threads_for


def say(command: str, text: str) -> None:
    print(f"elmo {command}: {text}", file=sys.stderr, flush=True)


def say_loading(command: str, model: object, threads: int | None, where: str = "torch on cpu") -> None:
    """``elmo COMMAND: loading the model M (where; N threads: why)``."""
    say(command, f"loading the model {model} ({where}; {threads_for(threads)})")
