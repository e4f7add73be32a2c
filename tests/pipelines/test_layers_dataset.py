"""``ElmoLayersDataset`` over real ``elmo embed --output all`` output: every row's layers, in order,
batched for ``ElmoMix``; outputs of other kinds are refused."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

from corpora.sotu import sotu_sentences
from inference import Embedder, ElmoMix
from pipelines import ElmoLayersDataset, OutputDirError, collate_layers, embed_parquet

ATOL = 1e-5  # layers read back from Parquet vs recomputed in other batches: float32 sums in another order


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus")
    texts = [" ".join(s) for _, s in zip(range(50), (s for _, s in sotu_sentences(newest_first=True, min_tokens=2)))]
    texts[3], texts[17] = None, ""  # a null row and an empty one keep their places
    for f in range(2):
        part = texts[f * 25 : (f + 1) * 25]
        pq.write_table(pa.table({"id": [f"r{f}-{i}" for i in range(25)], "text": part}), path / f"in-{f}.parquet")
    return path, texts


def test_rows_layers_and_batches(corpus, tiny_dir, tmp_path):
    path, texts = corpus
    embed_parquet(path, tmp_path / "out", tiny_dir, output="all", id_column="id", rows_per_shard=10,
                  sort_window_rows=8, quiet=True)
    data = ElmoLayersDataset(tmp_path / "out")
    assert len(data) == len(texts) and data.columns == ["id"]
    emb = Embedder.open(tiny_dir)
    want = emb.embed_sentences([(t or "").split() for t in texts], output="all")  # (L+1, T, D) each
    for i in list(range(len(texts))) + [5, 40, 2]:  # in order, then back and forth
        item = data[i]
        assert item["id"] == f"r{i // 25}-{i % 25}"
        assert item["layers"].dtype == torch.float32 and item["layers"].shape == want[i].shape
        np.testing.assert_allclose(item["layers"].numpy(), want[i], atol=ATOL, rtol=0, err_msg=f"row {i}")
    assert data[-1]["id"] == "r1-24"

    mix = ElmoMix(3, 2, dropout=0.0)
    with torch.no_grad():
        mix.mixes[0].scalars.copy_(torch.tensor([0.3, -0.2, 1.0]))
    loader = DataLoader(data, batch_size=7, collate_fn=collate_layers)
    seen = 0
    for batch in loader:
        B, n_layers, T, D = batch["layers"].shape
        assert batch["mask"].shape == (B, T) and len(batch["id"]) == B
        reps = mix(batch["layers"], batch["mask"])
        for b in range(B):
            n = int(batch["mask"][b].sum())
            w = torch.softmax(torch.tensor([0.3, -0.2, 1.0]), 0).numpy()
            expect = np.tensordot(w, want[seen + b], axes=1)  # (T, D)
            np.testing.assert_allclose(reps[0][b, :n].detach().numpy(), expect, atol=ATOL, rtol=0)
            assert not reps[0][b, n:].any()
        seen += B
    assert seen == len(texts)


def test_other_outputs_are_refused(corpus, tiny_dir, tmp_path):
    path, _ = corpus
    embed_parquet(path, tmp_path / "mixed", tiny_dir, quiet=True)
    with pytest.raises(OutputDirError, match="written with --output mixed; the layers dataset needs --output all"):
        ElmoLayersDataset(tmp_path / "mixed")
    with pytest.raises(OutputDirError, match="no _SUCCESS"):
        ElmoLayersDataset(tmp_path)
