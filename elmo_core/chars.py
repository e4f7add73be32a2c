"""Character ids exactly as the original ELMo computes them, vectorized with numpy.

A token becomes ``max_characters_per_token`` ids: BOW, its UTF-8 bytes (invalid characters
dropped, truncated to max_chars - 2), EOW, then PAD. The sentence markers ``<S>`` and ``</S>``
become [BOW, BOS, EOW, PAD...] and [BOW, EOS, EOW, PAD...]. Every id is then shifted by +1 so
that 0 means an all-padding (masked) token.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence, Sized

import numpy as np

from .errors import InputError, TokenTypeError

BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260
BOS_TOKEN, EOS_TOKEN = "<S>", "</S>"


def _marker_ids(char: int, max_chars: int) -> np.ndarray:
    ids = np.full(max_chars, PAD_CHAR, dtype=np.int32)
    ids[:3] = (BOW_CHAR, char, EOW_CHAR)
    return ids + 1


def bos_ids(max_chars: int = 50) -> np.ndarray:
    """Shape: (max_chars,) int32, the ids of the ``<S>`` token."""
    return _marker_ids(BOS_CHAR, max_chars)


def eos_ids(max_chars: int = 50) -> np.ndarray:
    """Shape: (max_chars,) int32, the ids of the ``</S>`` token."""
    return _marker_ids(EOS_CHAR, max_chars)


def _encode(tokens: Sequence[str]) -> list[bytes]:
    try:
        # "ignore" drops what cannot be encoded (lone surrogates), as the original does.
        return [t.encode("utf-8", "ignore") for t in tokens]
    except AttributeError:
        raise tokens_type_error(tokens) from None


def tokens_type_error(tokens: Sequence[object]) -> TokenTypeError:
    """The error naming the first of a flat list of tokens that is not a str by its place (a batch's
    ``pad_batch`` names it again by its sentence: ``token_type_error``)."""
    bad = next(i for i, t in enumerate(tokens) if not isinstance(t, str))
    return TokenTypeError(f"token {bad} is {type(tokens[bad]).__name__} {tokens[bad]!r}, expected str")


def token_type_error(sentences: Sequence[Sequence[object]]) -> TokenTypeError:
    """The error naming the first token of ``sentences`` that is not a str by its sentence and place
    (what the batch a model saw, windowed and sorted, cannot name)."""
    i, j, token = next((i, j, t) for i, s in enumerate(sentences) for j, t in enumerate(s) if not isinstance(t, str))
    return TokenTypeError(f"sentence {i}, token {j} is {type(token).__name__} {token!r}, expected str")


def tokens_to_char_ids(tokens: Sequence[str], max_chars: int = 50) -> np.ndarray:
    """Character ids of a flat list of tokens.

    Shape: (N,) tokens -> (N, max_chars) int32.
    """
    n = len(tokens)
    out = np.full((n, max_chars), PAD_CHAR + 1, dtype=np.int32)  # (N, C)
    if n == 0:
        return out
    encoded = _encode(tokens)
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=n)  # (N,)
    kept = np.minimum(lengths, max_chars - 2)  # (N,)
    flat = np.frombuffer(b"".join(encoded), dtype=np.uint8)  # (sum lengths,)
    starts = np.cumsum(lengths) - lengths  # (N,)
    tok_of_byte = np.repeat(np.arange(n), lengths)  # (sum lengths,)
    pos = np.arange(flat.size) - np.repeat(starts, lengths)  # position within its token
    keep = pos < max_chars - 2
    out[tok_of_byte[keep], pos[keep] + 1] = flat[keep].astype(np.int32) + 1
    out[:, 0] = BOW_CHAR + 1
    out[np.arange(n), kept + 1] = EOW_CHAR + 1
    _apply_markers(tokens, np.flatnonzero((lengths == 3) | (lengths == 4)), out, max_chars)
    return out


def _apply_markers(tokens: Sequence[str], candidates: np.ndarray, out: np.ndarray, max_chars: int) -> None:
    # The original maps a literal <S> / </S> token to the sentence-boundary characters.
    for i in candidates.tolist():
        t = tokens[i]
        if t == BOS_TOKEN:
            out[i] = bos_ids(max_chars)
        elif t == EOS_TOKEN:
            out[i] = eos_ids(max_chars)


def check_sentences(sentences: Sequence[Sequence[str]]) -> None:
    if isinstance(sentences, (str, bytes)):
        raise InputError("expected a list of sentences (lists of str tokens), got a single string")
    if not isinstance(sentences, Sized) or isinstance(sentences, (set, frozenset, dict)):  # read twice, in order
        raise InputError(f"expected a list of sentences (lists of str tokens), got {type(sentences).__name__}"
                         + (": pass list(...) of it" if isinstance(sentences, Iterable) else ""))
    for i, s in enumerate(sentences):
        if isinstance(s, (str, bytes)) or not isinstance(s, (list, tuple)):
            raise InputError(
                f"sentence {i} is {type(s).__name__}, expected a list of str tokens"
                + (" (split the text into tokens first)" if isinstance(s, str) else "")
            )


def batch_to_ids(sentences: Sequence[Sequence[str]], max_chars: int = 50) -> np.ndarray:
    """Character ids of a batch of tokenized sentences, padded with all-zero tokens.

    Shape: B sentences -> (B, T_max, max_chars) int32; a token is real where any id is non-zero.
    Boundary tokens are not added: the model adds them.
    """
    return ByteTokenizer(max_chars).batch(sentences)


def pad_batch(sentences: Sequence[Sequence[str]], ids_of: Callable[[list[str]], np.ndarray], width: int) -> np.ndarray:
    """Each sentence's token ids (``ids_of`` on all tokens at once) in a zero-padded batch.

    Shape: B sentences -> (B, T_max, width) int32.
    """
    check_sentences(sentences)
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)  # (B,)
    out = np.zeros((len(sentences), max(lengths, default=0), width), dtype=np.int32)  # (B, T, W)
    flat = [t for s in sentences for t in s]
    rows = np.repeat(np.arange(len(sentences)), lengths)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    try:
        out[rows, cols] = ids_of(flat)
    except TokenTypeError:
        raise token_type_error(sentences) from None
    return out


class ByteTokenizer:
    """The published models' token ids: UTF-8 bytes (see the module doc).

    Shape: ``token_ids`` N tokens -> (N, C); ``batch`` -> (B, T, C); ``boundary_ids`` (2, C) for <S>, </S>.
    """

    def __init__(self, max_chars: int = 50) -> None:
        self.max_chars = self.width = max_chars

    def token_ids(self, tokens: Sequence[str]) -> np.ndarray:
        return tokens_to_char_ids(tokens, self.max_chars)

    def batch(self, sentences: Sequence[Sequence[str]]) -> np.ndarray:
        return pad_batch(sentences, self.token_ids, self.width)

    def boundary_ids(self) -> np.ndarray:
        return np.stack([bos_ids(self.max_chars), eos_ids(self.max_chars)])
