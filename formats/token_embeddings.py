"""Token-embedding files: each vocabulary word's char-CNN representation, computed once.

The original's layout (bilm-tf ``dump_token_embeddings``, read by AllenNLP's ``vocab_to_cache``
users): one hdf5 file holding the dataset ``embedding``, float32 (V, P), whose row k is the
representation of line k of the vocabulary file (one token per line, stripped; ``<S>`` and
``</S>`` are the sentence-boundary tokens). We also write the dataset ``tokens`` (UTF-8 strings,
the same V tokens) so that our files need no vocabulary file beside them; readers of the original
layout ignore it. A file without it (the original's own) is read with its vocabulary file.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from storage.atomic import atomic_path
from elmo_core.errors import ElmoError

EMBEDDING = "embedding"
TOKENS = "tokens"


class TokenEmbeddingsError(ElmoError, ValueError):
    """A token-embedding file that is missing, malformed, or not from this model."""


@dataclass(frozen=True)
class TokenEmbeddings:
    """Shape: ``vectors`` (V, P) float32, row k for ``tokens[k]``."""

    tokens: list[str]
    vectors: np.ndarray


def read_vocab_lines(path: str | Path) -> list[str]:
    """The tokens of a vocabulary file, one per line, stripped, as bilm-tf's ``Vocabulary`` reads
    them (an empty line stays, so row k is still line k)."""
    path = Path(path)
    if not path.is_file():
        raise TokenEmbeddingsError(f"{path}: vocabulary file not found")
    try:
        with open(path, encoding="utf-8") as f:
            tokens = [line.strip() for line in f]
    except UnicodeDecodeError as e:
        raise TokenEmbeddingsError(f"{path}: not UTF-8 text ({e}); a vocabulary holds one UTF-8 token a line") from None
    if not tokens:
        raise TokenEmbeddingsError(f"{path}: the vocabulary file is empty")
    return tokens


def write_token_embeddings(path: str | Path, table: TokenEmbeddings) -> None:
    """Write atomically (a temporary file renamed over ``path``)."""
    path = Path(path)
    if table.vectors.shape[0] != len(table.tokens):
        raise TokenEmbeddingsError(f"{path}: {table.vectors.shape[0]} vectors for {len(table.tokens)} tokens")
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset(EMBEDDING, data=table.vectors.astype(np.float32, copy=False))
        f.create_dataset(TOKENS, data=table.tokens, dtype=h5py.string_dtype("utf-8"))


def read_token_embeddings(path: str | Path, vocab: str | Path | None = None) -> TokenEmbeddings:
    """A token-embedding file; ``vocab`` (a vocabulary file) names the rows of a file that does not
    list its tokens (the original's), and must agree with one that does."""
    path = Path(path)
    if not path.is_file():
        raise TokenEmbeddingsError(f"{path}: token-embedding file not found")
    try:
        with h5py.File(path, "r") as f:
            vectors = _dataset(f, EMBEDDING, path)
            stored = [t.decode("utf-8") for t in _dataset(f, TOKENS, path)] if TOKENS in f else None
    except OSError as exc:
        raise TokenEmbeddingsError(f"{path}: not a readable hdf5 file ({exc})") from exc
    if vectors.ndim != 2:
        raise TokenEmbeddingsError(f"{path}: dataset '{EMBEDDING}' has shape {vectors.shape}, expected (V, P)")
    tokens = _row_tokens(path, stored, vocab)
    if len(tokens) != vectors.shape[0]:
        where = vocab if stored is None else f"{path}:{TOKENS}"
        raise TokenEmbeddingsError(f"{path}: '{EMBEDDING}' has {vectors.shape[0]} rows but {where} lists "
                                   f"{len(tokens)} tokens; use the vocabulary the file was dumped from")
    return TokenEmbeddings(tokens, vectors.astype(np.float32, copy=False))


def _dataset(f: h5py.File, name: str, path: Path) -> np.ndarray:
    if name not in f or not isinstance(f[name], h5py.Dataset):
        raise TokenEmbeddingsError(f"{path}: no dataset '{name}' (a token-embedding file holds "
                                   f"'{EMBEDDING}' (V, P), as `elmo dump-tokens` writes it)")
    return f[name][()]


def _row_tokens(path: Path, stored: list[str] | None, vocab: str | Path | None) -> list[str]:
    if vocab is None:
        if stored is None:
            raise TokenEmbeddingsError(f"{path}: the file does not list its tokens (the original's layout); "
                                       f"pass the vocabulary file it was dumped from")
        return stored
    tokens = read_vocab_lines(vocab)
    if stored is not None and stored != tokens:
        k = next((i for i, (a, b) in enumerate(zip(stored, tokens)) if a != b), min(len(stored), len(tokens)))
        raise TokenEmbeddingsError(f"{path}: its tokens differ from {vocab} at row {k}; "
                                   f"leave the vocabulary out (the file lists its own tokens)")
    return tokens
