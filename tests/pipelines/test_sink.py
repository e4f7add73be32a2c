"""The first writer of a shard publishes it; a later writer of the same job's shard (a retried or
speculative task) adopts it, and a file that is not this job's shard under its name is refused."""
from __future__ import annotations

import pyarrow as pa
import pytest

from pipelines.options import EmbedOptions

from pipelines.errors import OutputDirError
from pipelines.output_dir import LocalDir
from pipelines.sink import ShardWriter, check_shard, read_commit
from pipelines.source import InputFile, Shard


def _shard(tmp_path) -> Shard:
    src = tmp_path / "in.parquet"
    src.write_bytes(b"x")
    stat = src.stat()
    return Shard(InputFile(0, src, 2, stat.st_size, stat.st_mtime_ns, "f", pa.schema([])), 0, 0, 2)


def _write(out, shard, values, digest="job"):
    schema = pa.schema([("v", pa.float32())])
    writer = ShardWriter(out, shard, schema, digest, EmbedOptions())
    writer.write(pa.table({"v": pa.array(values, pa.float32())}), lengths=pa.array([1, 1]).to_numpy())
    return writer


def test_two_writers_of_one_shard_leave_the_first_ones_bytes_and_a_record_of_them(tmp_path):
    out, shard = LocalDir(tmp_path / "out"), _shard(tmp_path)
    out.create()
    first, late = _write(out, shard, [1.0, 2.0]), _write(out, shard, [1.0, 2.5])  # both open at once
    record_first = first.commit()
    record_late = late.commit()  # its own bytes differ (another machine's rounding): it adopts the first's
    assert record_late["sha256"] == record_first["sha256"] and record_late["writer"] == "adopted"
    assert check_shard(out, shard.name, "job", 0, 0, 2)[0] is not None  # the record describes the bytes
    assert read_commit(out, shard.name)["sha256"] == record_first["sha256"]
    assert not list((tmp_path / "out").glob(".*.tmp"))  # neither left its temporary file


def test_a_file_that_is_not_this_jobs_shard_is_not_adopted(tmp_path):
    out, shard = LocalDir(tmp_path / "out"), _shard(tmp_path)
    out.create()
    _write(out, shard, [1.0, 2.0], digest="another job").commit()
    with pytest.raises(OutputDirError, match="not this job's shard"):
        _write(out, shard, [1.0, 2.0]).commit()
