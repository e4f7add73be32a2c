"""One home for text input (``corpora/``): ``elmo embed`` and ``elmo train`` see the same Parquet
files and decode bytes the same way."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from corpora.files import decode_utf8, input_files
from training.corpus import iter_records, list_shards


def test_embed_and_train_read_the_same_suffixes_as_parquet(tmp_path):
    table = pa.table({"text": ["the cat sat", "a b\u00a0c"]})
    for name in ("a.parquet", "b.parq", "c.pq", "_scratch/d.parquet", ".hidden.parquet"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        pq.write_table(table, tmp_path / name)
    (tmp_path / "notes.txt").write_text("the cat sat\n")
    assert [(p.name, f) for p, f in input_files(tmp_path)] == [("a.parquet", "parquet"), ("b.parq", "parquet"),
                                                          ("c.pq", "parquet")]  # elmo embed's INPUT
    for shard in list_shards(tmp_path):  # elmo train's corpus: every Parquet suffix read as Parquet
        records = [tokens for tokens, _ in iter_records(shard)]
        assert records == ([["the", "cat", "sat"]] if shard.suffix == ".txt" else [["the", "cat", "sat"], ["a", "b", "c"]])


def test_one_decoder_drops_invalid_bytes_and_says_so():
    assert decode_utf8("caf\u00e9".encode()) == ("caf\u00e9", False)
    assert decode_utf8(b"caf\xff\xfe!") == ("caf!", True)
