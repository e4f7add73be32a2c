"""Sentences nearest a query by their pooled ELMo vectors, over a local ``elmo embed --pool mean``
OUTPUT_DIR of any format and vector layout (one vector a row; rows without tokens, null there,
are left out)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from elmo_core.errors import InputError
from storage.locations import is_uri
from pipelines.output_dir import open_output
from pipelines.schema import ELMO_COLUMN, vector_array
from pipelines.shard_files import FORMATS, shard_format

from .probe import nearest


@dataclass(frozen=True)
class SentenceVectors:
    """Shape: texts N, vectors (N, D) float32."""

    texts: list[str]
    vectors: np.ndarray


def read_pooled(output_dir: str | Path, text_column: str = "text") -> SentenceVectors:
    """The texts and pooled vectors of a finished local OUTPUT_DIR, in input order."""
    if is_uri(output_dir):
        raise InputError(f"{output_dir}: the sentence search reads a local OUTPUT_DIR; copy it here first")
    suffixes = tuple(f.suffix for f in FORMATS.values())
    files = sorted(p for p in Path(output_dir).glob("part-*") if p.name.endswith(suffixes))
    if not files:
        raise InputError(f"{output_dir}: no shards (part-*{', part-*'.join(suffixes)}); run elmo embed --pool mean "
                         f"into it first")
    with open(files[0], "rb") as f:
        missing = {text_column, ELMO_COLUMN} - set(shard_format(files[0].name).schema(f).names)
    if missing:
        raise InputError(f"{output_dir}: its shards have no {sorted(missing)} column; embed with --keep-columns "
                         f"{text_column}")
    shards = open_output(output_dir)  # read as every reader of an OUTPUT_DIR reads its shards
    table = pa.concat_tables(shards.read_table(f.name, [text_column, ELMO_COLUMN]) for f in files)
    column = table.column(ELMO_COLUMN)
    table = table.filter(pc.is_valid(column))
    vectors = None if pa.types.is_list(column.type) else \
        vector_array(table.column(ELMO_COLUMN), table.schema.field(ELMO_COLUMN))  # (N, D) or (N, L+1, D)
    if vectors is None or vectors.ndim != 2:
        raise InputError(f"{output_dir}: its vectors are not one per row; embed with --pool mean (and --output "
                         f"mixed, top or average)")
    return SentenceVectors(table.column(text_column).to_pylist(), vectors.astype(np.float32))


def nearest_sentences(corpus: SentenceVectors, query: np.ndarray, k: int, query_text: str | None = None
                      ) -> list[tuple[str, float]]:
    """The ``k`` sentences nearest ``query`` (D,) by cosine, as (text, cosine); rows whose text is
    ``query_text`` are left out (the query itself, when it comes from the corpus)."""
    keep = [i for i, t in enumerate(corpus.texts) if t != query_text]
    vectors = np.concatenate([corpus.vectors[keep], np.asarray(query, dtype=np.float32)[None]])  # (n + 1, D)
    return [(corpus.texts[keep[i]], cos) for i, cos in nearest(len(keep), vectors, k)]
