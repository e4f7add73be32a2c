"""The loop that turns shards into committed output files, shared by both runners: the local
runner calls it with all pending shards, each Ray worker with the shards it is given.

Per input file, ``read_windows`` yields each shard's rows in windows; a prefetch thread prepares
them (tokens, windows, buckets, character ids) while this thread runs the model and writes; one
``ShardWriter`` writes a shard's rows in input order and commits it when its last window is in.
"""
from __future__ import annotations

import itertools
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


def embed_shards(predictor: ElmoPredictor, shards: list[Shard], out: Path, schema: pa.Schema, job_digest: str,
                 on_batch: Callable[[int, int], None] = lambda rows, tokens: None,
                 clock: StageClock | None = None) -> list[dict]:
    """Embed and commit ``shards`` (in input order); returns their commit records."""
    opts, clock = predictor.options, clock or StageClock()
    records: list[dict] = []
    writer: ShardWriter | None = None
    try:
        for shard, prepared, last in prefetch(_windows(shards, predictor, opts, clock), opts.prefetch):
            table = predictor.compute(prepared, clock)
            with clock.stage("write"):
                if writer is None:
                    writer = ShardWriter(out, shard, schema, job_digest, opts)
                writer.write(table, prepared.invalid_utf8)
                if last:
                    records.append(writer.commit())
                    writer = None
            on_batch(table.num_rows, prepared.plan.tokens)
    finally:
        if writer is not None:
            writer.abort()
    return records
