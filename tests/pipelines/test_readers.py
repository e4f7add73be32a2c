"""Every reader users have reads a finished ``elmo embed`` OUTPUT_DIR as it is, with no options,
in each layout it can: pyarrow, DuckDB, polars (``scan_*`` and ``read_*`` of the directory),
pandas and Spark (real libraries, one local Spark session for the module). Each gives every input
row once (in input order where the reader keeps the files' order; Spark's rows sorted by id), null
where the text is null, and exactly the vectors the shards hold, read shard by shard with the
format's own file reader (a binary layout viewed as floats: ``pipelines.schema.vector_array``).
The job's side files (``_job``, ``_manifest``, ``_shards/``, ``_SUCCESS``) are in the directory
as a finished job leaves them; no lock file is."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from corpora.sample import write_sample_corpus
from pipelines import embed_parquet
from pipelines.schema import vector_array
from pipelines.shard_files import shard_format

from tests.helpers import TINY_OPTIONS, make_model_dir

LAYOUTS = {"parquet floats": ("parquet", "floats"), "parquet binary": ("parquet", "binary"),
           "arrow floats": ("arrow", "floats"), "arrow binary": ("arrow", "binary")}
PARQUET = ["parquet floats", "parquet binary"]
RUN = dict(id_column="id", rows_per_shard=50, sort_window_rows=64, max_tokens_per_batch=2048, quiet=True)
ROWS, NULLS, EMPTY = 120, (63, 70), 66  # rows of the second input file: a null text, an empty one


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, tuple[Path, pa.Field, list]]:
    """Each layout's finished OUTPUT_DIR of one corpus (float32 vectors: every reader has the type),
    its ``elmo`` field and each row's vectors as the shard files hold them (None: a null row)."""
    root = tmp_path_factory.mktemp("readers")
    write_sample_corpus(root / "corpus", rows=ROWS, files=2, row_group_rows=40)
    second = root / "corpus" / "corpus-00001.parquet"
    table = pq.read_table(second)
    text = [None if i in NULLS else "" if i == EMPTY else t
            for i, t in zip(table.column("id").to_pylist(), table.column("text").to_pylist())]
    pq.write_table(table.set_column(table.schema.get_field_index("text"), "text", pa.array(text, pa.string())), second)
    model = make_model_dir(root / "tiny", TINY_OPTIONS)
    found = {}
    for name, (fmt, layout) in LAYOUTS.items():
        out = root / name.replace(" ", "-")
        embed_parquet(root / "corpus", out, model, format=fmt, vector_layout=layout, **RUN)
        rows, field = [], None
        for shard in sorted(out.glob("part-*")):
            with open(shard, "rb") as f:
                part = shard_format(shard.name).read_table(f, ["id", "elmo"])
            field = part.schema.field("elmo")
            rows += _rows(part.column("elmo"), field)
        found[name] = (out, field, rows)
    return found


def _rows(column: pa.ChunkedArray, field: pa.Field) -> list[np.ndarray | None]:
    """Each row's vectors (T, D) float32, None for a null row."""
    vectors = vector_array(column, field)
    ends = np.cumsum(pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False))
    return [None if valid is None else v for valid, v in zip(column.to_pylist(), np.split(vectors, ends[:-1]))]


def _as_arrays(values: list, layout: str) -> list[np.ndarray | None]:
    """A reader's rows of vectors (float lists, tuples or arrays; bytes for the binary layout) as
    (T, D) float32 arrays."""
    def row(tokens: object) -> np.ndarray:
        tokens = list(tokens)  # type: ignore[call-overload]
        if not tokens:
            return np.zeros((0, 0), np.float32)
        if layout == "binary":
            return np.frombuffer(b"".join(tokens), np.float32).reshape(len(tokens), -1)
        return np.array([np.asarray(t, np.float32) for t in tokens], np.float32)
    return [None if r is None else row(r) for r in values]


def _check(outputs: dict, name: str, ids: list, values: list, ordered: bool = True) -> None:
    """The reader's rows are every row once (in input order where ``ordered``) with the shards' vectors."""
    _, _, want = outputs[name]
    got = _as_arrays(values, LAYOUTS[name][1])
    if not ordered:
        order = np.argsort(ids)
        ids, got = [ids[i] for i in order], [got[i] for i in order]
    assert list(ids) == list(range(ROWS)), name
    assert [i for i, r in enumerate(got) if r is None] == list(NULLS) and len(got[EMPTY]) == 0, name
    for i, (g, w) in enumerate(zip(got, want)):
        if w is not None and len(w):
            np.testing.assert_array_equal(g, w, err_msg=f"{name}: row {i}")


def test_a_finished_output_holds_shards_its_records_and_no_lock(outputs):
    for name, (out, _, rows) in outputs.items():
        fmt = LAYOUTS[name][0]
        assert len(rows) == ROWS and sum(len(r) for r in rows if r is not None) > ROWS, name
        assert not list(out.glob(".*")), f"{name}: a finished output keeps no hidden file (lock, temporaries)"
        assert (out / "_SUCCESS").stat().st_size == 0
        assert {p.suffix for p in out.rglob("*") if p.is_file() and p.name != "_SUCCESS"} == {f".{fmt}"}, name


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_pyarrow_reads_the_directory(outputs, name):
    out, field, _ = outputs[name]
    table = ds.dataset(out, format=LAYOUTS[name][0]).to_table()
    assert table.schema.field("elmo").equals(field, check_metadata=True)  # the binary layout's dtype and shape
    _check(outputs, name, table.column("id").to_pylist(), table.column("elmo").to_pylist(), ordered=True)
    got = vector_array(table.column("elmo"), table.schema.field("elmo"))  # the documented view, every token
    np.testing.assert_array_equal(got, np.concatenate([r for r in outputs[name][2] if r is not None]))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_duckdb_reads_the_directory(outputs, name):
    """Parquet with DuckDB's own reader, given the directory; Arrow IPC through pyarrow's dataset
    (DuckDB reads no Arrow IPC file without an extension it would download)."""
    duckdb = pytest.importorskip("duckdb", reason="duckdb is in the dev extra")
    out, _, _ = outputs[name]
    if LAYOUTS[name][0] == "parquet":
        rows = duckdb.sql(f"SELECT id, elmo FROM read_parquet('{out}')").fetchall()
    else:
        dataset = ds.dataset(out, format="arrow")  # noqa: F841  (DuckDB finds it by its name)
        rows = duckdb.sql("SELECT id, elmo FROM dataset").fetchall()
    _check(outputs, name, [r[0] for r in rows], [r[1] for r in rows])


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_polars_scans_and_reads_the_directory(outputs, name):
    """``scan_parquet`` / ``read_parquet`` (``scan_ipc`` / ``read_ipc`` for Arrow) of the directory
    itself: polars takes every non-empty file under it and wants one extension, which the job's
    side records have (files of the shard format with no rows); ``_SUCCESS`` is empty."""
    pl = pytest.importorskip("polars", reason="polars is in the dev extra")
    out, _, _ = outputs[name]
    parquet = LAYOUTS[name][0] == "parquet"
    for spec in (str(out), f"{out}/"):
        frames = [pl.scan_parquet(spec).collect(), pl.read_parquet(spec)] if parquet else \
            [pl.scan_ipc(spec).collect(), pl.read_ipc(spec)]
        for frame in frames:
            _check(outputs, name, frame["id"].to_list(), frame["elmo"].to_list())


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_pandas_reads_the_directory(outputs, name):
    """The float layout into NumPy objects; the binary one into Arrow-backed columns
    (``dtype_backend="pyarrow"``, or ``types_mapper=pd.ArrowDtype`` through pyarrow for Arrow IPC:
    pyarrow makes no NumPy objects of a list of fixed-size binaries). Arrow IPC through pyarrow's
    dataset (pandas reads no directory of Arrow IPC files)."""
    pd = pytest.importorskip("pandas")
    out, _, _ = outputs[name]
    floats = name.endswith("floats")
    if LAYOUTS[name][0] == "parquet":
        frame = pd.read_parquet(out) if floats else pd.read_parquet(out, dtype_backend="pyarrow")
    else:
        table = ds.dataset(out, format="arrow").to_table()
        frame = table.to_pandas() if floats else table.to_pandas(types_mapper=pd.ArrowDtype)
    _check(outputs, name, frame["id"].tolist(), [None if v is None or v is pd.NA else v for v in frame["elmo"]])


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark", reason="the spark extra is not installed: pip install -e '.[spark]'")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java here (java on PATH or JAVA_HOME): Spark needs Java 17")
    from pipelines.spark_runner import spark_session

    session = spark_session("local[1]", ())
    yield session
    session.stop()


@pytest.mark.parametrize("name", PARQUET)
def test_spark_reads_the_directory(outputs, spark, name):
    """Spark reads Parquet (no Arrow IPC files); its rows come in no set order, so by id."""
    out, _, _ = outputs[name]
    rows = spark.read.parquet(str(out)).collect()
    _check(outputs, name, [r["id"] for r in rows], [None if r["elmo"] is None else [bytes(v) if isinstance(
        v, (bytes, bytearray)) else v for v in r["elmo"]] for r in rows], ordered=False)
