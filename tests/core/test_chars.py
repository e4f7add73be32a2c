from __future__ import annotations

import numpy as np
import pytest

from elmo_core import InputError, batch_to_ids, tokens_to_char_ids
from elmo_core.chars import bos_ids, eos_ids

from tests.reference_impl import char_ids as reference_char_ids

TOKENS = ["The", "cat", "", "Café", "日本語", "😀", "x" * 70, "é" * 30, "<S>", "</S>", "<S>x", "a\ud800b", "1790"]


def test_matches_straightforward_mapping():
    got = tokens_to_char_ids(TOKENS)
    want = np.array([reference_char_ids(t) for t in TOKENS])
    np.testing.assert_array_equal(got, want)


def test_layout_of_a_token():
    ids = tokens_to_char_ids(["ab"])[0]
    assert ids[:4].tolist() == [259, ord("a") + 1, ord("b") + 1, 260]
    assert (ids[4:] == 261).all()


def test_long_token_truncated_to_48_bytes():
    ids = tokens_to_char_ids(["é" * 30])[0]  # 60 bytes -> 48 kept, the last é split mid-character as the original
    assert ids[-1] == 260 and ids[1] == 0xC3 + 1 and ids[48] == 0xA9 + 1


def test_markers_and_invalid_characters():
    out = tokens_to_char_ids(["<S>", "</S>", "a\ud800b"])
    np.testing.assert_array_equal(out[0], bos_ids())
    np.testing.assert_array_equal(out[1], eos_ids())
    assert out[2][:4].tolist() == [259, ord("a") + 1, ord("b") + 1, 260]  # lone surrogate dropped


def test_batch_is_left_aligned_and_zero_padded():
    ids = batch_to_ids([["a", "b", "c"], [], ["d"]])
    assert ids.shape == (3, 3, 50)
    mask = (ids > 0).any(-1)
    assert mask.tolist() == [[True] * 3, [False] * 3, [True, False, False]]
    np.testing.assert_array_equal(ids[2, 0], tokens_to_char_ids(["d"])[0])


@pytest.mark.parametrize("bad, message", [
    ("a sentence", "single string"),
    (["not", "tokens"], "sentence 0 is str"),
    ([["ok"], ["fine", 3]], "sentence 1, token 1 is int 3, expected str"),  # not its place in the flat batch
    ([["ok"], None], "sentence 1 is NoneType"),
])
def test_bad_input_is_a_clear_error(bad, message):
    with pytest.raises(InputError, match=message):
        batch_to_ids(bad)


def test_a_token_that_is_not_str_is_named_by_its_sentence_and_place_in_a_windowed_batch(tiny_dir):
    from inference import Embedder

    with pytest.raises(InputError, match=r"sentence 1, token 300 is NoneType None, expected str"):
        Embedder.open(tiny_dir).embed_sentences([["a"], ["w"] * 300 + [None]])  # windowed (256), then sorted


def test_other_max_characters():
    ids = tokens_to_char_ids(["abcdefgh"], max_chars=6)[0]
    assert ids.tolist() == [259, 98, 99, 100, 101, 260]
