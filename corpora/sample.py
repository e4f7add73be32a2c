"""A sample Parquet corpus built at run time from the ``sotu`` package's public-domain speeches.

``elmo sample-corpus --out DIR``: files ``corpus-NNNNN.parquet`` with columns ``id`` (int64),
``speech`` (the speech's file id), ``text`` (one sentence, tokens separated by single spaces).
"""
from __future__ import annotations

from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from storage.atomic import atomic_path, make_parent
from elmo_core.bounds import check_count
from elmo_core.errors import SettingError

from .sotu import sotu_sentences


def write_sample_corpus(out_dir: str | Path, rows: int = 2000, files: int = 2, row_group_rows: int = 1000) -> list[Path]:
    """Write ``rows`` sentences into ``files`` Parquet files (an earlier sample's in ``out_dir`` replaced,
    other files kept); return their paths."""
    check_count("rows", rows)
    check_count("files", files)
    if files > rows:
        raise SettingError(f"`files` ({files}) must be at most `rows` ({rows}): each file holds one row or more")
    sentences = islice(sotu_sentences(newest_first=True, min_tokens=3), rows)
    picked = [(i, speech, " ".join(tokens)) for i, (speech, tokens) in enumerate(sentences)]
    if len(picked) < rows:
        raise SettingError(f"`rows` {rows}: the sotu package has only {len(picked)} sentences")
    out_dir = Path(out_dir)
    make_parent(out_dir, directory=True)  # a file in the way: InputError naming it
    out_dir.mkdir(exist_ok=True)
    per_file = -(-rows // files)
    paths = [out_dir / f"corpus-{k:05d}.parquet" for k in range(files)]
    for k, path in enumerate(paths):
        part = picked[k * per_file:(k + 1) * per_file]
        table = pa.table({"id": pa.array([p[0] for p in part], pa.int64()),
                          "speech": [p[1] for p in part], "text": [p[2] for p in part]})
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp, row_group_size=row_group_rows)
    for stale in set(out_dir.glob("corpus-[0-9][0-9][0-9][0-9][0-9].parquet")) - set(paths):
        stale.unlink()  # an earlier sample's files past this one's: the folder reads as this sample alone
    return paths
