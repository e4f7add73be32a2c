"""The demo's sentence search: an `elmo embed --pool mean` OUTPUT_DIR read back in input order, and
the nearest sentences by cosine, the query's own row left out."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from elmo_core.errors import InputError
from inference import Embedder
from pipelines import embed_parquet
from probing.sentence_search import SentenceVectors, nearest_sentences, read_pooled

TEXTS = ["the cat sat on the mat .", "", "a dog sat on a log .", "we work hard every day .", "cats sit ."]


@pytest.mark.parametrize("layout", [{}, {"format": "arrow", "vector_layout": "binary"},
                                    {"vector_layout": "binary", "dtype": "float16"}])
def test_pooled_vectors_read_back_and_searched(tiny_dir, tmp_path, layout):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": list(range(len(TEXTS))), "text": TEXTS}), tmp_path / "in" / "a.parquet")
    embed_parquet(tmp_path / "in", tmp_path / "out", tiny_dir, pool="mean", keep_columns=["text"], quiet=True,
                  rows_per_shard=2, **layout)
    corpus = read_pooled(tmp_path / "out")
    assert corpus.vectors.dtype == np.float32
    assert corpus.texts == [t for t in TEXTS if t]  # the empty row (null) left out, the order kept
    with Embedder.from_files(tiny_dir) as emb:
        want = emb.embed_sentences([t.split() for t in corpus.texts], output="mixed", pool="mean")
    np.testing.assert_allclose(corpus.vectors, np.stack(want), rtol=0, atol=2e-3 if layout.get("dtype") else 1e-6)
    found = nearest_sentences(corpus, corpus.vectors[0], 2, corpus.texts[0])
    assert len(found) == 2 and corpus.texts[0] not in [t for t, _ in found]
    assert found[0][1] >= found[1][1]
    embed_parquet(tmp_path / "in", tmp_path / "tokens", tiny_dir, keep_columns=["text"], quiet=True)
    with pytest.raises(InputError, match="not one per row; embed with --pool mean"):
        read_pooled(tmp_path / "tokens")
    with pytest.raises(InputError, match=r"no \['speech'\] column; embed with --keep-columns speech"):
        read_pooled(tmp_path / "tokens", "speech")
    with pytest.raises(InputError, match="no shards"):
        read_pooled(tmp_path / "in")


def test_nearest_sentences_by_cosine():
    corpus = SentenceVectors(["a", "b", "c"], np.array([[1, 0], [0, 1], [1, 1]], np.float32))
    assert [t for t, _ in nearest_sentences(corpus, np.array([1.0, 0.1]), 3)] == ["a", "c", "b"]
    assert nearest_sentences(corpus, np.array([1.0, 0.0]), 1, "a")[0] == ("c", pytest.approx(2 ** -0.5))
