"""The one tokenizer rule (``elmo_core.whitespace``): every door splits text at the same
characters, and Arrow counts a column's tokens as Python splits them."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from elmo_core.whitespace import TOKEN_PATTERN, WHITESPACE, split_tokens, token_spans
from pipelines import embed_parquet
from pipelines.options import EmbedOptions
from pipelines.rows import row_tokens
from pipelines.source import token_counts
from serving.schemas import EmbedRequest
from training.corpus import iter_sentences

# every Unicode whitespace class: ASCII controls, the information separators, NEL, NBSP, the
# Ogham and U+2000 spaces, line and paragraph separators, narrow NBSP, ideographic space; and
# characters that look like space but are not (zero-width space, word joiner, BOM, NUL)
NOT_SPACE = "\u200b\u2060\ufeff\x00"
TEXTS = [f"a{w}b c" for w in WHITESPACE] + [f"a{z}b c" for z in NOT_SPACE] + [
    "", " ", "\u3000\u00a0", "x", "  two\u2003words \n", None]


def test_token_spans_are_the_split_tokens_offsets_and_stop_at_a_limit():
    for text in TEXTS[:-1]:
        assert [text[a:b] for a, b in token_spans(text)] == split_tokens(text)
    text = "  one\u3000two\tthree "
    assert token_spans(text, 2) == token_spans(text)[:2] == [(2, 5), (6, 9)] and token_spans(text, 0) == []


def test_split_and_count_agree_on_every_whitespace_class():
    assert len(WHITESPACE) == 29 and all(w.isspace() for w in WHITESPACE)
    assert WHITESPACE == "".join(chr(c) for c in range(0x110000) if chr(c).isspace())
    want = [None if t is None else len(split_tokens(t)) for t in TEXTS]
    counted = pc.count_substring_regex(pa.array(TEXTS), TOKEN_PATTERN).to_pylist()
    assert counted == want
    assert want[: len(WHITESPACE)] == [3] * len(WHITESPACE)  # 'a', 'b', 'c'
    assert want[len(WHITESPACE): len(WHITESPACE) + len(NOT_SPACE)] == [2] * len(NOT_SPACE)  # 'a?b', 'c'
    assert split_tokens("a\u00a0b c") == ["a", "b", "c"]


def test_every_door_tokenizes_alike(tiny_dir, tmp_path):
    texts = [t for t in TEXTS if t is not None and t.strip()]
    want = [split_tokens(t) for t in texts]
    rows, bad = row_tokens(pa.array(texts), False, "text")  # elmo embed (Parquet, Ray, hdf5)
    assert rows == want and bad == 0
    counts = token_counts(pa.record_batch({"text": texts}), EmbedOptions())  # bounds elmo embed's sort windows
    assert counts.tolist() == [len(w) for w in want]
    assert EmbedRequest(texts=texts).token_lists() == want  # elmo serve
    corpus = tmp_path / "train.txt"
    corpus.write_text("".join(t.replace("\n", " ") + "\n" for t in texts), encoding="utf-8")  # one per line
    assert list(iter_sentences(str(corpus))) == want  # elmo train (text lines)
    pq.write_table(pa.table({"text": texts}), tmp_path / "in.parquet")
    assert list(iter_sentences(str(tmp_path / "in.parquet"), "text")) == want  # elmo train (Parquet)
    embed_parquet(tmp_path / "in.parquet", tmp_path / "out", tiny_dir, sort_window_tokens=8, quiet=True)
    got = ds.dataset(tmp_path / "out", format="parquet").to_table().column("elmo").to_pylist()
    assert [np.asarray(v).shape[0] for v in got] == [len(w) for w in want]
