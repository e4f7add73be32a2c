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
from typing import Sequence

import h5py
import numpy as np
import torch

from .atomic import atomic_path
from .bilm import BiLM
from .errors import ElmoError
from .token_cache import TokenCache

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
    with open(path, encoding="utf-8") as f:
        tokens = [line.strip() for line in f]
    if not tokens:
        raise TokenEmbeddingsError(f"{path}: the vocabulary file is empty")
    return tokens


def compute_token_embeddings(model: BiLM, tokens: Sequence[str], chunk: int = 4096) -> np.ndarray:
    """Each token's char-CNN representation (highway and projection included), as the model
    computes it inside a sentence.

    Shape: V tokens -> (V, P) float32.
    """
    ids = model.tokenizer.token_ids(tokens)  # (V, W)
    device = next(model.parameters()).device
    out = np.empty((len(tokens), model.config.lstm.projection_dim), dtype=np.float32)  # (V, P)
    with torch.inference_mode():
        for start in range(0, len(tokens), chunk):
            part = torch.from_numpy(ids[start : start + chunk]).to(device)  # (n, C)
            out[start : start + part.shape[0]] = model.encoder(part).float().cpu().numpy()  # (n, P)
    return out


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


def preload_token_cache(model: BiLM, table: TokenEmbeddings, cache: TokenCache, check_rows: int = 64) -> None:
    """Put a file's vectors into ``cache`` so that its tokens skip the char-CNN, after checking
    that this model computes the same vectors for a spread of its rows (atol = rtol = 1e-4): a file
    dumped from another model is an error, not silently wrong vectors."""
    ids = torch.from_numpy(model.tokenizer.token_ids(table.tokens))  # (V, W)
    vectors = torch.from_numpy(table.vectors)  # (V, P)
    P = model.config.lstm.projection_dim
    if vectors.shape[1] != P:
        raise TokenEmbeddingsError(f"token embeddings are {vectors.shape[1]}-wide but the model's projection is {P}; "
                                   f"dump them from this model (elmo dump-tokens)")
    device = next(model.parameters()).device
    rows = torch.linspace(0, len(table.tokens) - 1, min(check_rows, len(table.tokens))).long().unique()  # (k,)
    with torch.inference_mode():
        fresh = model.encoder(ids[rows].to(device)).float().cpu()  # (k, P)
    err = (fresh - vectors[rows]).abs() - 1e-4 * vectors[rows].abs()  # (k, P)
    if err.max() > 1e-4:
        k = int(rows[err.amax(dim=1).argmax()])
        raise TokenEmbeddingsError(f"token embeddings do not match this model's char-CNN (token {table.tokens[k]!r}, "
                                   f"row {k}: max |diff| {float((fresh - vectors[rows]).abs().max()):.3g}); "
                                   f"dump them from this model (elmo dump-tokens)")
    cache.preload(ids, vectors.to(device, next(model.parameters()).dtype), list(model.encoder.parameters()))
