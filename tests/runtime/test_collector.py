"""During a job, the objects alive when it started (modules, the model: ~200,000 in a job's process) are out of
the cyclic collector's full collections; after it, back as they were, and a process's own freeze is left alone."""
from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds

from corpora.sample import write_sample_corpus
from pipelines import embed_parquet
from runtime.collector import long_lived_frozen


def test_the_objects_alive_before_are_frozen_during_and_unfrozen_after():
    assert gc.get_freeze_count() == 0
    kept = [object() for _ in range(100)]
    with long_lived_frozen():
        assert gc.get_freeze_count() >= len(kept)  # the process's objects: out of every collection
        made: list = []  # the job's: in the collected generations as ever
        tracked = gc.get_objects()
        assert any(o is made for o in tracked) and not any(o is kept for o in tracked)
        del tracked
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    assert any(o is kept for o in gc.get_objects())


def test_a_process_that_froze_objects_itself_keeps_them_frozen():
    kept: list = []
    gc.freeze()
    try:
        with long_lived_frozen():
            pass
        assert gc.get_freeze_count() > 0 and not any(o is kept for o in gc.get_objects())  # not unfrozen by the job
    finally:
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())


def test_a_jobs_collections_run_with_the_process_frozen_and_it_is_unfrozen_after(tiny_dir: Path, tmp_path: Path):
    write_sample_corpus(tmp_path / "corpus", rows=200, files=1, row_group_rows=50)
    seen: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append(gc.get_freeze_count())

    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(50)  # collections every few allocations, whatever the suite left
    gc.callbacks.append(watch)
    try:
        embed_parquet(tmp_path / "corpus", tmp_path / "out", tiny_dir, quiet=True, max_tokens_per_batch=512)
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*thresholds)
        if not enabled:
            gc.disable()
    assert max(seen) > 10_000, seen[:20]  # the modules torch and pyarrow loaded: frozen while batches ran
    assert gc.get_freeze_count() == 0
    table = ds.dataset(tmp_path / "out", format="parquet").to_table()
    assert table.num_rows == 200 and np.isfinite(np.asarray(table.column("elmo")[0].values.to_pylist(), dtype=float)).all()
