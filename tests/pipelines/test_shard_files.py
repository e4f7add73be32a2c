"""The shard formats and vector layouts of ``elmo embed`` (``pipelines.shard_files``,
``pipelines.schema``): Parquet with float lists or fixed-size binary vectors, Arrow IPC with
either; the same vectors in each, the same protocol (verify, resume, a damaged shard found). Every
reader of each: tests/pipelines/test_readers.py."""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from elmo_core.errors import InputError
from pipelines import embed_parquet
from pipelines.schema import vector_array
from pipelines.verify import VerificationError, verify_output
from corpora.sample import write_sample_corpus

from tests.helpers import TINY_OPTIONS, make_model_dir

RUN = dict(id_column="id", rows_per_shard=50, max_tokens_per_batch=2048, sort_window_rows=64, quiet=True)
KINDS = [("parquet", "floats"), ("parquet", "binary"), ("arrow", "floats"), ("arrow", "binary")]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """One job per format and layout over the same corpus (float16 vectors, output mixed), and
    one of output all in binary Parquet."""
    root = tmp_path_factory.mktemp("formats")
    corpus, model = root / "corpus", make_model_dir(root / "tiny", TINY_OPTIONS)
    write_sample_corpus(corpus, rows=120, files=2, row_group_rows=40)
    made = {}
    for fmt, layout in KINDS:
        out = root / f"{fmt}-{layout}"
        made[fmt, layout] = (out, embed_parquet(corpus, out, model, format=fmt, vector_layout=layout,
                                                dtype="float16", **RUN))
    made["all"] = (root / "all", embed_parquet(corpus, root / "all", model, vector_layout="binary", output="all",
                                               **RUN))
    made["all-floats"] = (root / "all-floats", embed_parquet(corpus, root / "all-floats", model, output="all", **RUN))
    return corpus, model, made


def _table(out, fmt: str) -> pa.Table:
    return ds.dataset(out, format="arrow" if fmt == "arrow" else "parquet").to_table()


def test_every_format_and_layout_holds_the_same_vectors(outputs):
    _, _, made = outputs
    want = None
    for fmt, layout in KINDS:
        out, manifest = made[fmt, layout]
        table = _table(out, fmt)
        vectors = vector_array(table.column("elmo"), table.schema.field("elmo"))  # (tokens, D)
        assert vectors.shape == (manifest["tokens"], 16) and vectors.dtype == np.float16
        assert table.column("id").to_pylist() == list(range(120))
        assert sorted(p.suffix for p in out.glob("part-*")) == [f".{fmt}"] * 4
        assert manifest["options"]["format"] == fmt and manifest["options"]["vector_layout"] == layout
        assert manifest["options"]["compression"] == ("snappy" if fmt == "parquet" else "none")
        if layout == "binary":
            assert pa.types.is_fixed_size_binary(table.schema.field("elmo").type.value_type)
            assert table.schema.field("elmo").metadata == {b"elmo.dtype": b"float16", b"elmo.shape": b"[16]"}
        want = vectors if want is None else want
        np.testing.assert_array_equal(vectors, want)
    (binary, _), (floats, _) = made["all"], made["all-floats"]
    a, b = _table(binary, "parquet"), _table(floats, "parquet")
    np.testing.assert_array_equal(vector_array(a.column("elmo"), a.schema.field("elmo")),
                                  vector_array(b.column("elmo"), b.schema.field("elmo")))  # (tokens, 3, D)
    assert vector_array(a.column("elmo"), a.schema.field("elmo")).shape[1:] == (3, 16)


def test_the_binary_view_is_the_shards_memory():
    """Zero-copy: the numpy array reads the column's buffer, and torch.from_numpy shares it."""
    import torch

    values = np.arange(12, dtype=np.float16).reshape(3, 4)
    items = pa.Array.from_buffers(pa.binary(8), 3, [None, pa.py_buffer(values)])
    column = pa.ListArray.from_arrays(pa.array([0, 2, 3], pa.int32()), items)
    field = pa.field("elmo", column.type, metadata={b"elmo.dtype": b"float16", b"elmo.shape": b"[4]"})
    view = vector_array(column, field)
    assert np.shares_memory(view, values) and torch.from_numpy(view.copy()).shape == (3, 4)
    np.testing.assert_array_equal(view, values)
    with pytest.raises(ValueError, match="needs its field"):
        vector_array(column)


@pytest.mark.parametrize("fmt,layout", KINDS)
def test_each_kind_verifies_resumes_and_finds_a_damaged_shard(outputs, tmp_path, fmt, layout):
    corpus, model, made = outputs
    out, manifest = made[fmt, layout]
    assert verify_output(out)["rows"] == 120 and not (out / ".elmo.lock").exists()  # finished: no lock file
    copy = tmp_path / "copy"
    import shutil
    shutil.copytree(out, copy)
    shard = sorted(copy.glob("part-*"))[1]
    shard.unlink()
    resumed = embed_parquet(corpus, copy, model, format=fmt, vector_layout=layout, dtype="float16", resume=True,
                            **RUN)
    assert resumed["rows"] == 120 and resumed["this_run"]["shards"] == 1 and verify_output(copy)["ok"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(VerificationError, match="differ from its commit record"):
        verify_output(copy)


def test_a_format_takes_only_its_own_compressions(outputs, tmp_path):
    corpus, model, _ = outputs
    with pytest.raises(InputError, match=r"compression must be one of \['none', 'lz4', 'zstd'\], got 'snappy'"):
        embed_parquet(corpus, tmp_path / "x", model, format="arrow", compression="snappy", **RUN)
    with pytest.raises(InputError, match="vector_layout must be one of"):
        embed_parquet(corpus, tmp_path / "x", model, vector_layout="bytes", **RUN)
    assert not (tmp_path / "x").exists()
    m = embed_parquet(corpus, tmp_path / "lz4", model, format="arrow", compression="lz4", **RUN)
    assert m["options"]["compression"] == "lz4" and verify_output(tmp_path / "lz4")["ok"]


def test_the_summary_names_the_thread_that_bounds_the_job():
    """Workers' totals (a cluster's: each writes its one shard) compare as they are: the busiest
    thread's stages bound the job."""
    from pipelines.stages import StageClock

    clock = StageClock()
    clock.add({"read": 1.0, "prepare": 1.0, "model": 2.5, "assemble": 0.5, "write": 5.0})
    assert clock.report(6.0, "cpu")["bound_by"] == "write"
    clock.add({"model": 3.0})
    assert clock.report(6.0, "cpu")["bound_by"] == "model"  # 6.0 s against the writing's 5.0 s
    clock.add({"prepare": 5.0})
    assert clock.report(6.0, "cpu")["bound_by"] == "read"


def test_the_busiest_writer_bounds_the_writing():
    """A writer thread writes whole shards, its commits beside: with 2 shards and 8 writer threads
    the busiest writer's encoding and commits, not the writing shared by 8, bound the job (a GPU
    job's 2 shards were written in 28.4 thread-seconds beside the model thread's 14.5 s)."""
    import threading

    from pipelines.stages import StageClock

    clock = StageClock()
    clock.add({"model": 0.3, "assemble": 0.1})

    def write(seconds: float, commit: float) -> None:
        with clock.stage("write"):
            time.sleep(seconds)
        name = threading.current_thread().name

        def committing() -> None:  # in a thread of its own, timed for the writer whose shard it commits
            with clock.stage("write", writer=name):
                time.sleep(commit)

        beside = threading.Thread(target=committing, name=f"{name}-commit")
        beside.start()
        beside.join()

    threads = [threading.Thread(target=write, args=a, name=f"elmo-writer-{i}") for i, a in enumerate(((0.3, 0.2), (0.1, 0)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = clock.report(1.0, "cpu")
    assert report["bound_by"] == "write"  # 0.5 s on one writer against the model thread's 0.4 s
    assert sorted(report["writers"]) == ["elmo-writer-0", "elmo-writer-1"] and report["writers"]["elmo-writer-0"] >= 0.5

def test_a_parquet_shard_is_written_in_row_groups_of_at_most_row_group_bytes(tmp_path, monkeypatch):
    """pyarrow builds a row group's levels for all its values at once (~10 bytes of memory a byte of
    float16 vectors): a window's piece is cut into groups of ``ROW_GROUP_BYTES`` (a larger row
    alone), and reads back whole and in order."""
    import io

    import pyarrow.parquet as pq

    from pipelines import shard_files

    monkeypatch.setattr(shard_files, "ROW_GROUP_BYTES", 64 << 10)
    rows, dim = 100, 512  # 2 KB of float32 a token, 1..19 tokens a row: ~40 KB a row on average
    lengths = np.arange(rows) % 19 + 1
    vectors = np.arange(lengths.sum() * dim, dtype=np.float32).reshape(-1, dim)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    elmo = pa.ListArray.from_arrays(offsets, pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim))
    table = pa.table({"id": np.arange(rows), "elmo": elmo})
    huge = pa.table({"id": [rows], "elmo": pa.ListArray.from_arrays(pa.array([0, 40], pa.int32()),
                                                                  pa.FixedSizeListArray.from_arrays(
                                                                      pa.array(np.ones(40 * dim, np.float32)), dim))})
    file = io.BytesIO()
    writer = shard_files.FORMATS["parquet"].writer(file, table.schema, "snappy", {})
    writer.write(table), writer.write(huge)  # a window's piece, then one row of 80 KB
    writer.close({"rows": rows + 1})
    meta = pq.ParquetFile(io.BytesIO(file.getvalue())).metadata
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    per_group = (64 << 10) * rows // table.nbytes
    assert groups[-1] == 1 and sum(groups) == rows + 1 and len(groups) >= table.nbytes // (64 << 10)
    assert max(groups[:-1]) == per_group
    assert pq.read_table(io.BytesIO(file.getvalue())).equals(pa.concat_tables([table, huge]))


LEVELS_PROBE = """
import io, json
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from pipelines.shard_files import FORMATS
lengths = np.random.default_rng(0).integers(1, 40, 1600)  # a window's piece: 32k tokens, float16, D = 1024: 66 MB
vectors = np.random.default_rng(1).standard_normal((lengths.sum(), 1024)).astype(np.float16)
offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
flat = pa.Array.from_buffers(pa.float16(), vectors.size, [None, pa.py_buffer(vectors)])
table = pa.table({"id": np.arange(len(lengths)), "elmo": pa.ListArray.from_arrays(offsets, pa.FixedSizeListArray.from_arrays(flat, 1024))})
pool, file = pa.default_memory_pool(), io.BytesIO()
before = pool.max_memory()
writer = FORMATS["parquet"].writer(file, table.schema, "snappy", {})
writer.write(table)
writer.close({"rows": table.num_rows})
peak = pool.max_memory() - before
same = pq.read_table(io.BytesIO(file.getvalue())).equals(table)
print(json.dumps({"piece": table.nbytes, "peak": peak, "same": same, "pool": pool.backend_name}))
"""


def test_a_parquet_shards_levels_are_built_a_chunk_at_a_time():
    """pyarrow builds the levels of the Arrow array it is handed at once (~10 bytes of its memory pool
    a byte of float16 vectors: a 66 MB piece written as 16 MiB row groups took the pool to 188 MB,
    fresh pages each window); handed ``LEVEL_CHUNK_BYTES`` at a time, the pool's peak is a chunk's
    levels and a page's buffers (19 MB measured), whatever the piece's or the row group's size.
    A process of its own, so that no earlier test's peak hides this one's."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", LEVELS_PROBE], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"}, cwd=repo)
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout)
    assert probe["same"] and probe["piece"] > 60e6
    assert probe["peak"] <= 32 << 20, probe  # whole 16 MiB row groups: 188 MB
