"""The loop that turns shards into committed output files, shared by both runners: the local
runner calls it with all pending shards, each Ray worker with the shards it is given.

Per input file, ``read_windows`` yields the shards' rows in windows (a window may span shards); a
prefetch thread prepares them (tokens, windows, buckets, character ids), the calling thread runs
the model, and writer threads (``--writer-threads``, default 1) encode and write: each window's
rows go to their shards' writers, one ``ShardWriter`` per shard writes its rows in input order and
commits it when its last rows are in.
"""
from __future__ import annotations

import itertools
import queue
import threading
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from elmo_core.errors import InputError
from runtime.buffers import BufferPool, Lease
from runtime.collector import long_lived_frozen

from .options import EmbedOptions

from .errors import NonFiniteError
from .predictor import ElmoPredictor, Prepared
from .prefetch import prefetch
from .sink import Output, ShardWriter
from .stages import StageClock
from .rows import row_values
from .source import Shard, Window, read_windows


def _timed(items: Iterator, clock: StageClock, name: str) -> Iterator:
    """``items``, the time spent producing each one counted as stage ``name``."""
    while True:
        with clock.stage(name):
            item = next(items, None)
        if item is None:
            return
        yield item


def _windows(shards: list[Shard], predictor: ElmoPredictor, opts: EmbedOptions, clock: StageClock,
             span: bool) -> Iterator[tuple[Window, Prepared]]:
    """Each window of ``shards`` (``read_windows``) with its prepared rows; errors name the file and
    the window's rows."""
    for file, group in itertools.groupby(shards, key=lambda s: s.file):
        rows: tuple[int, int] | None = None  # the file rows of the window read last
        try:
            for window in _timed(read_windows(file, list(group), opts, span), clock, "read"):
                rows = (window.start, window.start + window.table.num_rows - 1)
                with clock.stage("prepare"):
                    prepared = predictor.prepare(window.table)
                yield window, prepared
        except InputError as e:
            where = f", rows {rows[0]}..{rows[1]} (the window holding the bad row)" if rows is not None else ""
            raise InputError(f"{file.path}{where}: {e}") from None


def _invalid_utf8(window: Window, total: int, opts: EmbedOptions) -> list[int]:
    """The strings with invalid UTF-8 among each piece's rows (``total`` in the window): decoded
    again piece by piece only where a window of several pieces holds any."""
    if total == 0 or len(window.pieces) == 1:
        return [total] + [0] * (len(window.pieces) - 1)
    name = opts.tokens_column or opts.text_column
    column, counts, offset = window.table.column(name), [], 0
    for piece in window.pieces:
        counts.append(row_values(column.slice(offset, piece.rows), opts.tokens_column is not None, name)[1])
        offset += piece.rows
    return counts


class _Room:
    """What the writer pool holds at once: at most ``windows`` windows and ``limit`` bytes of their
    vectors (None: no bound), or one window alone whatever its size (a large one never waits
    forever). A window is held from its queueing until its last piece is written: its pieces are
    slices of one buffer, which lives until then."""

    def __init__(self, windows: int) -> None:
        self.windows, self.limit = windows, None
        self.held, self.bytes = 0, 0
        self.changed = threading.Condition()

    def take(self, size: int, timeout: float) -> bool:
        """Room for a window of ``size`` bytes, taken; False where there was none within ``timeout`` s."""
        def fits() -> bool:
            room = self.limit is None or self.bytes + size <= self.limit
            return self.held == 0 or (self.held < self.windows and room)
        with self.changed:
            if not self.changed.wait_for(fits, timeout):
                return False
            self.held, self.bytes = self.held + 1, self.bytes + size
            return True

    def give(self, size: int) -> None:
        with self.changed:
            self.held, self.bytes = self.held - 1, self.bytes - size
            self.changed.notify_all()

    def allow(self, limit: int) -> None:
        """At least ``limit`` bytes held from now on."""
        with self.changed:
            self.limit = max(self.limit or 0, limit)
            self.changed.notify_all()


class _Held:
    """A window in the room: given back, and its buffers to their pool (``lease``), when the last
    of its ``pieces`` is written (at once where it has none)."""

    def __init__(self, room: _Room, size: int, pieces: int, lease: Lease) -> None:
        self.room, self.size, self.left, self.lease, self.lock = room, size, pieces, lease, threading.Lock()
        if pieces == 0:
            self._done()

    def written(self) -> None:
        with self.lock:
            self.left -= 1
            done = self.left == 0
        if done:
            self._done()

    def _done(self) -> None:
        self.lease.release()
        self.room.give(self.size)


class _WriterThread:
    """Writes and commits shards in a thread of its own, in the order given: Parquet encoding releases
    the GIL, so it runs beside the model. A shard's commit (checksum, fsync and rename, or the
    completion of its upload to a store) runs in one more thread beside the next shard's encoding,
    one commit at a time. A window waits for the pool's ``room``; an error in the thread
    reaches the caller at its next window or ``put``, or at ``close``; its open shard is aborted either way. Stopped
    (the job failed or was signalled), it writes what is already queued (a few windows: the pool's
    room), so a shard whose rows were all computed is committed, and aborts the one left open."""

    def __init__(self, out: Output, schema: pa.Schema, job_digest: str, opts: EmbedOptions, model_sha256: str | None,
                 clock: StageClock, name: str = "elmo-writer") -> None:
        self.args, self.clock = (out, schema, job_digest, opts, model_sha256), clock
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
                shard, table, lengths, invalid_utf8, last, held = item
                with self.clock.stage("write"):
                    writer = writer or ShardWriter(self.args[0], shard, *self.args[1:])
                    writer.write(table, lengths, invalid_utf8)
                    if last:
                        self._commit_beside(writer)
                        writer = None
                held.written()
                item = table = None  # the window's buffer is freed once its last piece is written
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
    Parquet), each by one thread, in row order. Windows queued or being written, in all: at most 3
    with one thread (two waiting, one in hand), 16 per thread with several, so that each can hold
    a shard of up to ~16 windows; and at most ``WINDOWS_HELD`` windows' vectors (the largest window
    yet: on an 80 GB GPU a window is 4 GiB of float32 vectors, so 16 per thread would be hundreds
    of GiB), which W shards of 1/W of a window each fill (``pipelines.shard_size``). See
    docs/pipelines.md for memory."""

    WINDOWS_HELD = 3

    def __init__(self, out: Output, schema: pa.Schema, job_digest: str, opts: EmbedOptions, model_sha256: str | None,
                 clock: StageClock) -> None:
        n = opts.writer_threads
        self.room = _Room(3 if n == 1 else 16 * n)
        self.threads = [_WriterThread(out, schema, job_digest, opts, model_sha256, clock, f"elmo-writer-{i}")
                        for i in range(n)]
        self.assigned: dict[str, _WriterThread] = {}

    def window(self, table: pa.Table, pieces: int, lease: Lease) -> _Held:
        """Room for a window's vectors (``table``, on ``lease``'s buffers), waited for, to queue its
        ``pieces`` by ``put``: the bound on bytes follows the largest window yet."""
        size = max(table.nbytes, lease.nbytes)  # a reused buffer may be larger than the vectors
        self.room.allow(self.WINDOWS_HELD * size)
        while not self.room.take(size, timeout=0.1):
            self._raise_errors()
        return _Held(self.room, size, pieces, lease)

    def put(self, shard: Shard, table: pa.Table, lengths: np.ndarray, invalid_utf8: int, last: bool,
            held: _Held) -> None:
        """Queue a shard's next rows (``lengths``: their token counts, -1 null; ``last``: its last
        ones), a piece of the window ``held``."""
        self._raise_errors()
        thread = self.assigned.setdefault(shard.name, self.threads[len(self.assigned) % len(self.threads)])
        thread.queue.put((shard, table, lengths, invalid_utf8, last, held))

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
                 clock: StageClock | None = None, span: bool = False) -> list[dict]:
    """Embed and commit ``shards`` (in input order); returns their commit records. The prefetch
    thread reads and prepares, this one runs the model, the writer threads write; each shard records
    the sha256 of the model the predictor loaded. ``span``: windows go on past a shard's end
    (``read_windows``; the local runner's, whose writer threads take the shards of a window at once)."""
    opts, clock = predictor.options, clock or StageClock()
    writer = _WriterPool(out, schema, job_digest, opts, predictor.model_sha256, clock)
    buffers = BufferPool()  # this call's windows' memory, dropped with it (a Ray actor's between tasks)
    try:
        with long_lived_frozen():  # the process's objects out of full collections (runtime/collector.py)
            for window, prepared in prefetch(_windows(shards, predictor, opts, clock, span), opts.prefetch):
                lease = buffers.lease()  # the window's vectors, in memory an earlier window's held
                try:
                    table = predictor.compute(prepared, clock, lease.empty)
                except NonFiniteError as e:
                    row = window.start + e.row
                    raise NonFiniteError(f"{window.file.path}: row {row}: {e}", row) from None
                held = writer.window(table, sum(p.shard is not None for p in window.pieces), lease)
                lengths, offset, rows, tokens = prepared.plan.lengths, 0, 0, 0  # (R,)
                for piece, invalid in zip(window.pieces, _invalid_utf8(window, prepared.invalid_utf8, opts)):
                    if piece.shard is not None:  # else rows of a committed shard: dropped
                        part = table if len(window.pieces) == 1 else table.slice(offset, piece.rows)
                        counts = lengths[offset : offset + piece.rows]  # (rows,) -1: null
                        writer.put(piece.shard, part, counts, invalid, piece.last, held)
                        rows, tokens = rows + piece.rows, tokens + int(np.maximum(counts, 0).sum())
                    offset += piece.rows
                on_batch(rows, tokens)
            return writer.close()
    finally:
        writer.abort()
