"""The static rows' shape (``inference.row_lstm``): R rows of T steps, and the row count a batch
takes. Torch-free, so the batch planner (``inference.batching``) and the options that carry a
job's rows load no model code.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RowShape:
    """R rows of T steps: one window's shape (as a job's bound: the most rows a batch may take)."""

    rows: int = 1024
    steps: int = 8

    def for_batch(self, lengths: list[int], step_rows: int = 128) -> "RowShape":
        """The rows (a power of two up to ``rows``) that run a batch of ``lengths`` in the least
        time, a step costing as much as ``step_rows`` rows besides its own (its launches and
        latency). A batch of few long sentences takes fewer rows: a row is at least as long as
        the longest sentence, so many rows would be mostly padding; and a row holds whole
        sentences, some row ceil(n / rows) of them, so at least the shortest ones."""
        tokens, n = sum(lengths), len(lengths)
        shortest = list(itertools.accumulate(sorted(lengths), initial=0))  # (n+1,) the k shortest's tokens

        def cost(rows: int) -> int:
            return self.cost(rows, tokens, max(max(lengths, default=1), shortest[min(n, -(-n // rows))]), step_rows)
        return RowShape(min(self.row_counts(), key=lambda r: (cost(r), -r)), self.steps)

    def cost(self, rows: int, tokens: int, longest: int, step_rows: int = 128) -> int:
        """What ``for_batch`` minimises: the windows of ``rows`` rows a batch of ``tokens`` whose
        fullest row holds at least ``longest`` takes at the least, each costing ``rows + step_rows``."""
        return math.ceil(max(longest, math.ceil(tokens / rows)) / self.steps) * (rows + step_rows)

    def row_counts(self, most_sentences: int | None = None) -> list[int]:
        """Every row count ``for_batch`` may choose (the powers of two from 8 up to ``rows``), for
        batches of at most ``most_sentences`` sentences where given."""
        counts = [self.rows >> k for k in range(self.rows.bit_length()) if self.rows >> k >= 8] or [self.rows]
        if most_sentences is not None:
            counts = [r for r in counts if r < 2 * most_sentences] or counts[-1:]
        return counts
