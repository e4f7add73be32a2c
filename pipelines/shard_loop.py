"""The loop that turns shards into committed output files, shared by both runners: the local
runner calls it with all pending shards, each Ray worker with the shards it is given.

Per input file, ``read_windows`` yields each shard's rows in windows; a prefetch thread prepares
them (tokens, windows, buckets, character ids), the calling thread runs the model, and writer
threads (``--writer-threads``, default 1) encode and write: one ``ShardWriter`` per shard writes
its rows in input order and commits it when its last window is in.
"""
from __future__ import annotations

import itertools
import queue
import threading
from typing import Callable, Iterator

import pyarrow as pa

from elmo_core.errors import InputError

from .options import EmbedOptions

from .errors import NonFiniteError
from .predictor import ElmoPredictor
from .prefetch import prefetch
from .sink import Output, ShardWriter
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
    the GIL, so it runs beside the model. A shard's commit (checksum, fsync and rename, or the
    completion of its upload to a store) runs in one more thread beside the next shard's encoding,
    one commit at a time. A table waits for one of the pool's ``slots``; an error in the thread
    reaches the caller at its next ``put`` or at ``close``; its open shard is aborted either way. Stopped
    (the job failed or was signalled), it writes what is already queued (a few tables: the pool's
    slots), so a shard whose rows were all computed is committed, and aborts the one left open."""

    def __init__(self, out: Output, schema: pa.Schema, job_digest: str, opts: EmbedOptions, model_sha256: str | None,
                 clock: StageClock, slots: threading.Semaphore, name: str = "elmo-writer") -> None:
        self.args, self.clock, self.slots = (out, schema, job_digest, opts, model_sha256), clock, slots
        self.queue: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.records: list[dict] = []
        self.error: BaseException | None = None
        self.committing: threading.Thread | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        writer: ShardWriter | None = None
        try:
            while True:  # once stopped, what is queued is still written: a shard queued whole is committed
                try:
                    item = self.queue.get(timeout=0.1)
                except queue.Empty:
                    if self.stop.is_set():
                        return
                    continue
                if item is None:
                    return
                shard, table, lengths, invalid_utf8, last = item
                with self.clock.stage("write"):
                    writer = writer or ShardWriter(self.args[0], shard, *self.args[1:])
                    writer.write(table, lengths, invalid_utf8)
                    if last:
                        self._commit_beside(writer)
                        writer = None
                self.slots.release()
        except BaseException as e:  # handed to the caller, which re-raises it
            self.error = self.error or e
        finally:
            if writer is not None:
                writer.abort()
            self._wait_commit()

    def _commit_beside(self, writer: ShardWriter) -> None:
        """Commit ``writer``'s shard in a thread of its own, once the previous commit is done."""
        self._wait_commit()
        if self.error is not None:
            raise self.error

        def commit() -> None:
            try:
                with self.clock.stage("write", writer=self.thread.name):  # the shard's writer's time
                    self.records.append(writer.commit())
            except BaseException as e:  # handed to the caller through the writer thread's error
                self.error = self.error or e

        self.committing = threading.Thread(target=commit, name=f"{self.thread.name}-commit", daemon=True)
        self.committing.start()

    def _wait_commit(self) -> None:
        if self.committing is not None:
            self.committing.join()
            self.committing = None


class _WriterPool:
    """``opts.writer_threads`` writer threads; shard k (in input order) goes to thread k mod n, so
    that several shards are encoded at once (a GPU job makes vectors faster than one core encodes
    Parquet), each by one thread, in row order. Tables queued or being written, in all: at most 3
    with one thread (two waiting, one in hand), 16 per thread with several, so that each can hold
    a shard of up to ~16 windows (see docs/pipelines.md for memory)."""

    def __init__(self, out: Output, schema: pa.Schema, job_digest: str, opts: EmbedOptions, model_sha256: str | None,
                 clock: StageClock) -> None:
        n = opts.writer_threads
        self.slots = threading.Semaphore(3 if n == 1 else 16 * n)
        self.threads = [_WriterThread(out, schema, job_digest, opts, model_sha256, clock, self.slots, f"elmo-writer-{i}")
                        for i in range(n)]
        self.assigned: dict[str, _WriterThread] = {}

    def put(self, item: tuple) -> None:
        """Queue (shard, table, row lengths, invalid_utf8, last); waits while the pool is full."""
        while not self.slots.acquire(timeout=0.1):
            self._raise_errors()
        self._raise_errors()
        shard = item[0]
        thread = self.assigned.setdefault(shard.name, self.threads[len(self.assigned) % len(self.threads)])
        thread.queue.put(item)

    def _raise_errors(self) -> None:
        for t in self.threads:
            if t.error is not None:
                raise t.error
            if not t.thread.is_alive():
                raise RuntimeError(f"the shard writer thread {t.thread.name} ended unexpectedly")

    def close(self) -> list[dict]:
        """Finish what is queued; the commit records in input order, or a thread's error."""
        for t in self.threads:
            t.queue.put(None)
        for t in self.threads:
            t.thread.join()
        for t in self.threads:
            if t.error is not None:
                raise t.error
        return sorted((r for t in self.threads for r in t.records), key=lambda r: r["file"])

    def abort(self) -> None:
        """Stop after the tables being written (their shards are aborted, temporary files removed)."""
        for t in self.threads:
            t.stop.set()
        for t in self.threads:
            t.thread.join(timeout=120)


def embed_shards(predictor: ElmoPredictor, shards: list[Shard], out: Output, schema: pa.Schema, job_digest: str,
                 on_batch: Callable[[int, int], None] = lambda rows, tokens: None,
                 clock: StageClock | None = None) -> list[dict]:
    """Embed and commit ``shards`` (in input order); returns their commit records. The prefetch
    thread reads and prepares, this one runs the model, the writer threads write; each shard records
    the sha256 of the model the predictor loaded."""
    opts, clock = predictor.options, clock or StageClock()
    writer = _WriterPool(out, schema, job_digest, opts, predictor.model_sha256, clock)
    done: dict[str, int] = {}  # rows of each shard computed so far
    try:
        for shard, prepared, last in prefetch(_windows(shards, predictor, opts, clock), opts.prefetch):
            try:
                table = predictor.compute(prepared, clock)
            except NonFiniteError as e:
                row = shard.start + done.get(shard.name, 0) + e.row
                raise NonFiniteError(f"{shard.file.path}: row {row}: {e}", row) from None
            done[shard.name] = done.get(shard.name, 0) + table.num_rows
            writer.put((shard, table, prepared.plan.lengths, prepared.invalid_utf8, last))
            on_batch(table.num_rows, prepared.plan.tokens)
        return writer.close()
    finally:
        writer.abort()
