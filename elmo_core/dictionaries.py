"""Token ids from character and word dictionaries, exactly as ELMoForManyLangs builds them
(HIT-SCIR ELMoForManyLangs, elmoformanylangs/elmo.py and frontend.py, 0.0.4.post2).

Their conventions, each kept (their dictionary files are read by ``formats.model_dir.read_dictionary``):
- a sentence is ``<bos> tokens... <eos>``; a token longer than ``max_chars - 2`` characters is cut
  to that many, for its characters and its word lookup alike;
- a token's characters are ``[id(<eow>), its characters..., id(<bow>), id(<pad>)...]``: their code
  swaps the two word markers (frontend.py: ``bow_id, eow_id = char2id['<eow>'], char2id['<bow>']``),
  and the model was trained so; a boundary token is ``[id(<eow>), id(<bos>|<eos>), id(<bow>), pad...]``;
  an unknown character is ``<oov>``; padding characters are real ids, convolved like others;
- a word not in the word dictionary is ``<oov>``; lookups are case-sensitive, nothing is normalised.
Every id is stored +1 here, so that 0 still means an all-padding (masked) token; with words, the
word id (+1) is one more column after the characters.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .chars import pad_batch, tokens_type_error

CHAR_SPECIALS = ("<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>")
WORD_SPECIALS = ("<oov>", "<bos>", "<eos>", "<pad>")


class DictionaryTokenizer:
    """Shape: ``token_ids`` N tokens -> (N, W), W = max_chars (+1 with words); ``batch`` -> (B, T, W);
    ``boundary_ids`` (2, W) for <bos>, <eos>."""

    def __init__(self, chars: dict[str, int], words: dict[str, int] | None, max_chars: int) -> None:
        self.chars, self.words, self.max_chars = chars, words, max_chars
        self.width = max_chars + (1 if words is not None else 0)
        self.first, self.last = chars["<eow>"] + 1, chars["<bow>"] + 1  # swapped, as their frontend does
        self.pad, self.oov = chars["<pad>"] + 1, chars["<oov>"] + 1

    def _row(self, char_ids: list[int]) -> np.ndarray:
        row = np.full(self.max_chars, self.pad, dtype=np.int32)  # (C,)
        row[: len(char_ids) + 2] = [self.first, *char_ids, self.last]
        return row

    def _word(self, token: str) -> int:
        assert self.words is not None
        return self.words.get(token, self.words["<oov>"]) + 1

    def token_ids(self, tokens: Sequence[str]) -> np.ndarray:
        if not all(isinstance(t, str) for t in tokens):  # a list or bytes would be read as its items
            raise tokens_type_error(tokens)
        out = np.empty((len(tokens), self.width), dtype=np.int32)  # (N, W)
        get, oov, keep = self.chars.get, self.oov, self.max_chars - 2
        for i, token in enumerate(tokens):
            token = token[:keep]
            out[i, : self.max_chars] = self._row([get(c, oov - 1) + 1 for c in token])
            if self.words is not None:
                out[i, -1] = self._word(token)
        return out

    def batch(self, sentences: Sequence[Sequence[str]]) -> np.ndarray:
        return pad_batch(sentences, self.token_ids, self.width)

    def boundary_ids(self) -> np.ndarray:
        out = np.empty((2, self.width), dtype=np.int32)  # (2, W)
        for k, marker in enumerate(("<bos>", "<eos>")):
            out[k, : self.max_chars] = self._row([self.chars[marker] + 1])
            if self.words is not None:
                out[k, -1] = self.words[marker] + 1
        return out
