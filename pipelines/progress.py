"""A job's progress on stderr: ``note`` (what it is doing, one line) and a one-line progress bar
(rows, tokens, tokens/s, ETA), refreshed at most twice a second."""
from __future__ import annotations

import sys
import time
from typing import TextIO


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def note(text: str, quiet: bool = False) -> None:
    """One line on stderr saying what the job is doing now (silent when ``quiet``)."""
    if not quiet:
        print(f"elmo embed: {text}", file=sys.stderr, flush=True)


class ProgressBar:
    """``update(rows, tokens)`` after each batch; ``close()`` ends the line. Silent when ``quiet``.
    Rows and tokens both count the whole job (``done_*``: those of shards kept from an earlier run);
    the rates and the ETA count this run's work only."""

    def __init__(self, total_rows: int, done_rows: int = 0, quiet: bool = False, stream: TextIO | None = None,
                 interval: float = 0.5, done_tokens: int = 0) -> None:
        self.total, self.rows, self.tokens = total_rows, done_rows, done_tokens
        self.start_rows, self.start_tokens = done_rows, done_tokens
        self.quiet, self.stream, self.interval = quiet, stream or sys.stderr, interval
        self.t0 = self.last = time.perf_counter()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        if not self.tty:  # a log file: a line after the first batch, then every 10 s, not a redraw
            self.interval = max(self.interval, 10.0)

    def update(self, rows: int, tokens: int, at_once: bool = False) -> None:
        """``at_once``: a line now (a finished shard, for a runner that hears of whole shards)."""
        self.rows += rows
        self.tokens += tokens
        now = time.perf_counter()
        first = self.rows - rows == self.start_rows  # the first batch: a line at once, then every interval
        if not self.quiet and (at_once or now - self.last >= self.interval or (first and not self.tty)):
            self.last = now
            self._draw(now, end="\r" if self.tty else "\n")

    def line(self, now: float | None = None) -> str:
        elapsed = max(1e-9, (now or time.perf_counter()) - self.t0)
        rate_rows = (self.rows - self.start_rows) / elapsed
        eta = (self.total - self.rows) / rate_rows if rate_rows > 0 else float("nan")
        pct = 100.0 * self.rows / self.total if self.total else 100.0
        eta_s = _duration(eta) if eta == eta else "?"
        return (f"rows {self.rows:,}/{self.total:,} ({pct:5.1f}%) | tokens {self.tokens:,} | "
                f"{(self.tokens - self.start_tokens) / elapsed:,.0f} tokens/s | elapsed {_duration(elapsed)} | "
                f"ETA {eta_s}")

    def _draw(self, now: float, end: str) -> None:
        print(self.line(now).ljust(100), end=end, file=self.stream, flush=True)

    def close(self) -> None:
        if not self.quiet and self.tty:
            print(file=self.stream, flush=True)
