"""Token-embedding files: ``elmo dump-tokens`` against the original's own file, and
``--token-embeddings`` in the Embedder, ``elmo embed`` and ``elmo serve`` (same vectors, the
file's tokens never reach the char-CNN)."""
from __future__ import annotations

from pathlib import Path

import h5py
import httpx
import numpy as np
import pyarrow.dataset as ds
import pytest

from elmo_cli.main import main
from elmo_core.errors import InputError
from formats.token_embeddings import TokenEmbeddingsError, read_token_embeddings
from inference import Embedder
from pipelines import embed_parquet
from corpora.sample import write_sample_corpus
from tests.helpers import make_model_dir, tiny_options

ATOL = 1e-5  # a char-CNN vector read from a file vs computed in another batch: float32 sums in another order


def test_dump_tokens_matches_the_original_file(fixture_model, fixture_dir, tmp_path):
    out = tmp_path / "token_embeddings.hdf5"
    assert main(["dump-tokens", "--model", str(fixture_model), "--vocab", str(fixture_dir / "vocab_test.txt"),
                 "--out", str(out)]) == 0
    with h5py.File(fixture_dir / "elmo_token_embeddings.hdf5") as f:
        want = f["embedding"][()]  # (458, 16)
    with h5py.File(out) as f:
        got = f["embedding"][()]
        assert f["embedding"].dtype == np.float32
        tokens = [t.decode() for t in f["tokens"][()]]
    assert got.shape == want.shape == (458, 16)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    assert tokens == (fixture_dir / "vocab_test.txt").read_text().splitlines()


def _sentences_and_vocab(fixture_dir: Path) -> tuple[list[list[str]], list[str]]:
    vocab = (fixture_dir / "vocab_test.txt").read_text().splitlines()
    rng = np.random.default_rng(0)
    sentences = [[vocab[i] for i in rng.integers(2, len(vocab), n)] for n in (3, 9, 1, 14)]
    return sentences, vocab


def test_known_tokens_skip_the_char_cnn_with_the_same_vectors(fixture_model, fixture_dir):
    sentences, _ = _sentences_and_vocab(fixture_dir)
    sentences.append(["unseen-word", "Café"] + sentences[0])  # tokens the file lacks go through the char-CNN
    plain = Embedder.open(fixture_model, token_cache=0)
    with_file = Embedder.open(fixture_model, token_cache=0, token_embeddings=str(fixture_dir / "elmo_token_embeddings.hdf5"),
                              token_vocab=str(fixture_dir / "vocab_test.txt"))
    cache = with_file.backend.fast.token_cache
    for output in ("all", "mixed"):
        for got, want in zip(with_file.embed_sentences(sentences, output=output),
                             plain.embed_sentences(sentences, output=output)):
            np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    distinct_unknown = 2  # "unseen-word" and "Café": the only char-CNN work, once per call
    assert cache.misses == 2 * distinct_unknown and cache.hits > 0


def test_a_file_from_another_model_or_vocabulary_is_refused(fixture_model, fixture_dir, tmp_path):
    original = str(fixture_dir / "elmo_token_embeddings.hdf5")
    vocab = str(fixture_dir / "vocab_test.txt")
    with pytest.raises(TokenEmbeddingsError, match="does not list its tokens.*vocabulary"):
        read_token_embeddings(original)
    short = tmp_path / "short_vocab.txt"
    short.write_text("\n".join(Path(vocab).read_text().splitlines()[:100]) + "\n")
    with pytest.raises(TokenEmbeddingsError, match=r"has 458 rows but .*short_vocab.txt lists 100 tokens"):
        read_token_embeddings(original, short)
    other = make_model_dir(tmp_path / "other", tiny_options(lstm__projection_dim=16), seed=3)
    with pytest.raises(TokenEmbeddingsError, match="do not match this model's char-CNN"):
        Embedder.open(other, token_embeddings=original, token_vocab=vocab)
    narrow = make_model_dir(tmp_path / "narrow", tiny_options(), seed=3)
    with pytest.raises(TokenEmbeddingsError, match="16-wide but the model's projection is 8"):
        Embedder.open(narrow, token_embeddings=original, token_vocab=vocab)
    with pytest.raises(InputError, match="names the rows of a token-embedding file; pass that file too"):
        Embedder.open(fixture_model, token_vocab=vocab)
    with pytest.raises(InputError, match="torch backend only"):
        Embedder.open(tmp_path, "onnx", token_embeddings=original)


def test_embed_and_serve_with_token_embeddings(tiny_dir, tmp_path):
    from tests.serving.server_utils import ServerProcess, decode

    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=40, files=1)
    texts = ds.dataset(corpus, format="parquet").to_table().column("text").to_pylist()
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["<S>", "</S>"] + sorted({t for x in texts for t in x.split()})) + "\n")
    tokens = tmp_path / "tokens.hdf5"
    assert main(["dump-tokens", "--model", str(tiny_dir), "--vocab", str(vocab), "--out", str(tokens)]) == 0
    want = Embedder.open(tiny_dir).embed_sentences([t.split() for t in texts], output="mixed")

    embed_parquet(corpus, tmp_path / "out", tiny_dir, token_embeddings=str(tokens), quiet=True)
    got = ds.dataset(tmp_path / "out", format="parquet").to_table().column("elmo").to_pylist()
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(g, np.float32).reshape(w.shape), w, atol=ATOL, rtol=0, err_msg=f"row {i}")

    server = ServerProcess(tiny_dir, "--token-embeddings", str(tokens), "--quiet")
    try:
        body = httpx.post(f"{server.url}/embed", json={"texts": texts[:8]}, timeout=30).json()
    finally:
        server.stop()
    for i, item in enumerate(body["embeddings"]):
        np.testing.assert_allclose(decode(item, "float", want[i].shape), want[i], atol=ATOL, rtol=0)
