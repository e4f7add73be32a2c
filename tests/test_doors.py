"""Every door into the model gives the same vectors for the same sentences: ``Embedder``, ``elmo
embed`` to Parquet (local; and pooled, unit length) and to hdf5, ``elmo serve``'s ``/embed`` and
``/v1/embeddings`` (pooled, unit length). Ray runs ``elmo embed``'s own predictor (tests/pipelines/test_ray_runner.py), the Triton
model ``Embedder.embed_sentences`` (tests/serving/test_triton.py).

Tolerance 1e-6: every door runs the one engine (``inference.batching``), so the only difference is
how a server batch is composed (other rows beside a sentence change the GEMM's blocking, hence the
order of its float32 sums). A tiny-model output is a sum of K <= 64 products of O(1) terms; rounding
errors that add as a random walk stay near sqrt(K) * 2**-24 * |x| ~ 5e-7 for |x| ~ 1.
"""
from __future__ import annotations

from itertools import islice

import httpx
import h5py
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from corpora.sotu import sotu_sentences
from elmo_core.whitespace import split_tokens
from inference import Embedder
from inference.batching import BatchPolicy
from pipelines import embed_parquet
from pipelines.hdf5_output import embed_to_hdf5
from tests.serving.server_utils import ServerProcess

ATOL = 1e-6  # see the module doc
WINDOW = 24  # --max-sentence-tokens: the longest rows below go through windows
HOSTILE = ["", "   ", "a\x00b c", "emoji 😀 🎉 and ZWJ 👩‍👩‍👧 family", "é" * 30 + " " + "日本語" * 6,
           " ".join(f"w{k}" for k in range(70)), "tab\tand\u00a0nbsp\u3000ideographic", "x"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    picked = [" ".join(tokens) for _, tokens in islice(sotu_sentences(newest_first=True), 300)]
    return picked + HOSTILE


def _policy() -> BatchPolicy:
    return BatchPolicy(max_sentence_length=WINDOW, max_tokens_per_batch=256)


def test_every_door_gives_the_engines_vectors(tiny_dir, tmp_path, texts):
    tokens = [split_tokens(t) for t in texts]
    want = Embedder.open(tiny_dir, policy=_policy()).embed_sentences(tokens, output="mixed")
    budget = dict(max_sentence_length=WINDOW, max_tokens_per_batch=256, quiet=True)

    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet")
    embed_parquet(tmp_path / "in.parquet", tmp_path / "out", tiny_dir, sort_window_rows=64, **budget)
    got = ds.dataset(tmp_path / "out", format="parquet").to_table().column("elmo").to_pylist()
    _same(want, [np.asarray(g, np.float32).reshape(-1, 16) for g in got], "parquet")

    embed_to_hdf5(tmp_path / "in.parquet", tmp_path / "out.hdf5", tiny_dir, sort_window_rows=100, **budget)
    with h5py.File(tmp_path / "out.hdf5") as f:
        _same(want, [f[str(i)][()] for i in range(len(texts))], "hdf5")

    pooled = [w.mean(0, dtype=np.float64) if len(w) else None for w in want]
    unit = [None if p is None else (p / np.linalg.norm(p)).astype(np.float32) for p in pooled]
    embed_parquet(tmp_path / "in.parquet", tmp_path / "unit", tiny_dir, pool="mean", normalize=True, **budget)
    got = ds.dataset(tmp_path / "unit", format="parquet").to_table().column("elmo").to_pylist()
    assert [g is None for g in got] == [u is None for u in unit]
    _same([u for u in unit if u is not None], [np.asarray(g, np.float32) for g in got if g is not None],
          "parquet --pool mean --normalize")

    short = [i for i, t in enumerate(tokens) if 0 < len(t) <= WINDOW]  # the server refuses longer ones (413)
    server = ServerProcess(tiny_dir, "--max-sentence-tokens", str(WINDOW), "--max-batch-tokens", "256")
    try:
        r = httpx.post(f"{server.url}/embed", json={"texts": [texts[i] for i in short]}, timeout=60).json()
        _same([want[i] for i in short], [np.asarray(v, np.float32).reshape(-1, 16) for v in r["embeddings"]], "/embed")
        r = httpx.post(f"{server.url}/v1/embeddings", json={"input": [texts[i] for i in short]}, timeout=60).json()
        _same([unit[i] for i in short], [np.asarray(d["embedding"], np.float32) for d in r["data"]], "/v1/embeddings")
    finally:
        server.stop()


def _same(want: list[np.ndarray], got: list[np.ndarray], door: str) -> None:
    assert len(got) == len(want), door
    for i, (w, g) in enumerate(zip(want, got)):
        assert g.shape == w.shape, (door, i, g.shape, w.shape)
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0, err_msg=f"{door}: sentence {i}")
