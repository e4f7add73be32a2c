"""The loop that turns shards into committed output files, shared by both runners: the local
runner calls it with all pending shards, each Ray worker with the shards it is given.

Per input file, ``read_windows`` yields each shard's rows in windows; a prefetch thread prepares
them (tokens, windows, buckets, character ids), the calling thread runs the model, and a writer
thread encodes and writes: one ``ShardWriter`` at a time writes a shard's rows in input order and
commits it when its last window is in.
"""
from __future__ import annotations

import itertools
import queue
import threading
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa

from elmo_core.errors import InputError

from .options import EmbedOptions
from .predictor import ElmoPredictor
from .prefetch import prefetch
from .sink import ShardWriter
from .stages import StageClock
from .source import Shard, read_windows


def _timed(items: Iterator, clock: StageClock, name: str) -> Iterator:
    """``items``, the time spent producing each one counted as stage ``name``."""
    while True:
        with clock.stage(name):
            item = next(items, None)
        if item is None:
            return
        yield item


def _windows(shards: list[Shard], predictor: ElmoPredictor, opts: EmbedOptions, clock: StageClock) -> Iterator[tuple]:
    """(shard, prepared window, last window of the shard); errors name the file and its rows."""
    for file, group in itertools.groupby(shards, key=lambda s: s.file):
        row, current, n = None, None, 0
        try:
            for shard, table, last in _timed(read_windows(file, list(group), opts), clock, "read"):
                row = shard.start if shard is not current else row + n
                current, n = shard, table.num_rows
                with clock.stage("prepare"):
                    prepared = predictor.prepare(table)
                yield shard, prepared, last
        except InputError as e:
            where = f", rows {row}..{row + n - 1} (the window holding the bad row)" if row is not None else ""
            raise InputError(f"{file.path}{where}: {e}") from None


class _WriterThread:
    """Writes and commits shards in a thread of its own, in the order given: Parquet encoding releases
    the GIL, so it runs beside the model. At most ``depth`` tables wait; an error in the thread
    reaches the caller at its next ``put`` or at ``close``; its open shard is aborted either way."""

    def __init__(self, out: Path, schema: pa.Schema, job_digest: str, opts: EmbedOptions, clock: StageClock,
                 depth: int = 2) -> None:
        self.args, self.clock = (out, schema, job_digest, opts), clock
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.records: list[dict] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="elmo-writer", daemon=True)
        self.thread.start()

    def put(self, item: tuple | None) -> None:
        """Queue (shard, table, row lengths, invalid_utf8, last), or None to finish; waits while full."""
        while True:
            if self.error is not None:
                raise self.error
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                if not self.thread.is_alive():
                    raise RuntimeError("the shard writer thread ended unexpectedly") from self.error

    def _run(self) -> None:
        writer: ShardWriter | None = None
        try:
            while not self.stop.is_set():
                try:
                    item = self.queue.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is None:
                    return
                shard, table, lengths, invalid_utf8, last = item
                with self.clock.stage("write"):
                    writer = writer or ShardWriter(self.args[0], shard, *self.args[1:])
                    writer.write(table, lengths, invalid_utf8)
                    if last:
                        self.records.append(writer.commit())
                        writer = None
        except BaseException as e:  # handed to the caller, which re-raises it
            self.error = e
        finally:
            if writer is not None:
                writer.abort()

    def close(self) -> list[dict]:
        """Finish what is queued; the commit records, or the thread's error."""
        self.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.records

    def abort(self) -> None:
        """Stop after the table being written (its shard is aborted, its temporary file removed)."""
        self.stop.set()
        self.thread.join(timeout=120)


def embed_shards(predictor: ElmoPredictor, shards: list[Shard], out: Path, schema: pa.Schema, job_digest: str,
                 on_batch: Callable[[int, int], None] = lambda rows, tokens: None,
                 clock: StageClock | None = None) -> list[dict]:
    """Embed and commit ``shards`` (in input order); returns their commit records. Three threads:
    the prefetch thread reads and prepares, this one runs the model, the writer thread writes."""
    opts, clock = predictor.options, clock or StageClock()
    writer = _WriterThread(out, schema, job_digest, opts, clock)
    try:
        for shard, prepared, last in prefetch(_windows(shards, predictor, opts, clock), opts.prefetch):
            table = predictor.compute(prepared, clock)
            writer.put((shard, table, prepared.plan.lengths, prepared.invalid_utf8, last))
            on_batch(table.num_rows, prepared.plan.tokens)
        return writer.close()
    finally:
        writer.abort()
