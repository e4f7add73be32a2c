"""Corpus reading, vocabulary and batching, on real files (text, gzip, Parquet)."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from elmo_core.chars import tokens_to_char_ids
from elmo_core.errors import InputError
from training.corpus import list_shards
from training.data import BpttBatcher, SentenceBatcher, SentenceStream
from training.errors import CorpusError
from training.vocab import Vocab, build_vocab


def _read_all(path, **kw):
    stream = SentenceStream(path, n_epochs=1, **kw)
    out = []
    while (s := stream.next_sentence()) is not None:
        out.append(s)
    return out, stream.stats


def test_text_empty_lines_and_invalid_utf8_are_counted(tmp_path):
    p = tmp_path / "c.txt"
    p.write_bytes(b"the cat sat\n\n   \nbad \xff\xfebyte here\nlast line\n")
    sents, stats = _read_all(p)
    assert sents == [["the", "cat", "sat"], ["bad", "byte", "here"], ["last", "line"]]
    assert (stats.sentences, stats.tokens, stats.empty, stats.invalid_utf8) == (3, 8, 2, 1)


def test_gzip_parquet_directory_and_glob(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    with gzip.open(d / "a.txt.gz", "wt", encoding="utf-8") as f:
        f.write("one two\nthree\n")
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["four five", None, "six"]}), d / "b.parquet")
    pq.write_table(pa.table({"tokens": [["seven", "eight"], []]}), d / "c.parquet")
    sents, stats = _read_all(d)
    assert sents == [["one", "two"], ["three"], ["four", "five"], ["six"], ["seven", "eight"]]
    assert stats.empty == 2
    assert [p.name for p in list_shards(str(d / "*.parquet"))] == ["b.parquet", "c.parquet"]


@pytest.mark.parametrize("case, match", [
    ("missing", "no such file"), ("glob", "matches no file"), ("column", "no column 'body'"),
    ("nocolumn", "no text column"), ("empty", "no non-empty sentence"), ("emptydir", "holds no corpus file"),
    ("jsonl", "a jsonl file; a training corpus is text"), ("csv", "a csv file; a training corpus is text"),
    ("csv.gz", "a csv file; a training corpus is text"),
    ("damaged", r"rows from 0 on cannot be read \(.*\); the file is damaged"),
    ("nulltoken", r"row 1, column 'tokens': expected a string or a list of strings, got a list whose item 1 is null"),
])
def test_bad_corpora_are_clear_errors(tmp_path, case, match):
    path, kw = tmp_path / "missing.txt", {}
    if case == "glob":
        path = tmp_path / "*.txt"
    elif case in ("column", "nocolumn"):
        path = tmp_path / "t.parquet"
        pq.write_table(pa.table({"id": [1], "text": ["a b"]} if case == "column" else {"id": [1]}), path)
        kw = {"column": "body"} if case == "column" else {}
    elif case == "empty":
        path = tmp_path / "e.txt"
        path.write_text("\n  \n\n")
    elif case == "emptydir":
        path = tmp_path / "d"
        path.mkdir()
    elif case in ("jsonl", "csv"):  # tables: not read as lines of text (their keys and header as words)
        path = tmp_path / f"t.{case}"
        path.write_text('{"text": "a b"}\n' if case == "jsonl" else "text\na b\n")
    elif case == "csv.gz":
        path = tmp_path / "t.csv.gz"
        with gzip.open(path, "wt") as f:
            f.write("text\na b\n")
    elif case == "nulltoken":
        path = tmp_path / "t.parquet"
        pq.write_table(pa.table({"tokens": [["a", "b"], ["c", None]]}), path)
        kw = {"column": "tokens"}
    elif case == "damaged":  # a readable footer, pages of flipped bytes
        path = tmp_path / "t.parquet"
        pq.write_table(pa.table({"text": [f"w{i} x y" for i in range(20000)]}), path, compression="none",
                       use_dictionary=False)
        data = bytearray(path.read_bytes())
        data[8:4000] = bytes(b ^ 0x5A for b in data[8:4000])  # the first page's header and values
        assert len(data) > 100_000  # the footer, at the end, untouched
        path.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match=match) as e:
        _read_all(path, **kw)
    assert str(path.name) in str(e.value) or case == "glob"


def test_a_shard_whose_name_is_not_utf8_is_refused_naming_it(tmp_path):
    import os

    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("one two\n")
    bad = os.fsdecode(os.fsencode(str(d)) + b"/b\xffd.txt")  # a name the file system holds, not UTF-8
    with open(bad, "w") as f:
        f.write("three\n")
    with pytest.raises(InputError, match=r"b\\xffd.txt: the name is not UTF-8 .* rename it"):
        list_shards(d)


def test_vocab_specials_first_then_by_count(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("b a b\nc b a\nd\n")
    v = build_vocab(p, min_count=2)
    assert v.tokens == ["<S>", "</S>", "<UNK>", "b", "a"]
    v.save(tmp_path / "vocab.txt")
    assert Vocab.load(tmp_path / "vocab.txt").tokens == v.tokens
    assert v.ids(["a", "zzz"]).tolist() == [4, 2]
    with pytest.raises(CorpusError, match="lacks"):
        Vocab(["a", "b"])


def test_bptt_rows_are_continuous_streams_both_directions(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("a b c\nd e\nf\ng h i j\n")
    vocab = Vocab(["<S>", "</S>", "<UNK>", *"abcdefghij"])
    batcher = BpttBatcher(SentenceStream(p, n_epochs=1), vocab, batch_size=2, unroll=3)
    b1, b2 = batcher.next_batch(), batcher.next_batch()
    ids = lambda toks: vocab.ids(toks).tolist()  # noqa: E731
    # row 0: <S> a b c </S> -> fwd inputs <S> a b | c ; row 1: <S> d e </S>, <S> f </S> ...
    assert b1.targets[0, 0].tolist() == ids(["a", "b", "c"])
    assert b1.targets[1, 0].tolist() == ids(["c", "b", "a"])  # backward reads </S> c b
    np.testing.assert_array_equal(b1.chars[1, 0].numpy(), tokens_to_char_ids(["</S>", "c", "b"]))
    # row 0 finishes its sentence, then takes the next one from the stream (rows fill in order)
    assert b2.targets[0, 0].tolist() == ids(["</S>", "f", "</S>"])
    assert b2.targets[1, 0].tolist() == ids(["<S>", "f", "<S>"])
    assert b1.targets[0, 1].tolist() == ids(["d", "e", "</S>"])
    assert b2.targets[0, 1].tolist() == ids(["g", "h", "i"])
    assert b1.mask.all() and b1.total_tokens == 6


def test_data_position_resumes_exactly_through_json(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("".join(f"w{i} x{i % 7} y{i % 3}\n" for i in range(60)))
    vocab = build_vocab(p)

    def make():
        return BpttBatcher(SentenceStream(p, n_epochs=2, shuffle_buffer=8, seed=3), vocab, 3, 4)

    straight = make()
    ref = [straight.next_batch() for _ in range(30)]
    first = make()
    for _ in range(11):
        first.next_batch()
    second = make()
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for want in ref[11:]:
        got = second.next_batch()
        assert got is not None and want is not None
        assert np.array_equal(got.targets, want.targets) and np.array_equal(got.chars, want.chars)


def test_sentence_batches_pad_and_mask(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("a b c\nd\n")
    vocab = Vocab(["<S>", "</S>", "<UNK>", *"abcd"])
    b = SentenceBatcher(SentenceStream(p, n_epochs=1), vocab, 4).next_batch()
    assert b.mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert b.targets[0, 0].tolist() == vocab.ids(["a", "b", "c", "</S>"]).tolist()
    assert b.targets[1, 0].tolist() == vocab.ids(["c", "b", "a", "<S>"]).tolist()
    assert b.targets[1, 1, :2].tolist() == vocab.ids(["d", "<S>"]).tolist()


def test_shuffling_reads_shards_in_a_new_random_order_each_pass(tmp_path):
    """As bilm-tf picks shards at random: each pass reads every sentence once, shards in a new order."""
    d = tmp_path / "shards"
    d.mkdir()
    for k in range(8):  # sentence "s<k> <i>": its shard is readable from its first token
        (d / f"{k:02d}.txt").write_text("".join(f"s{k} {i}\n" for i in range(5)))
    everything = sorted((f"s{k}", str(i)) for k in range(8) for i in range(5))

    stream = SentenceStream(d, n_epochs=2, shuffle_buffer=2, seed=7)  # buffer 2: shards barely interleave
    order0 = list(stream.order)
    both = [stream.next_sentence() for _ in range(80)]
    assert stream.next_sentence() is None
    assert sorted(map(tuple, both)) == sorted(everything * 2)  # every sentence once per pass
    assert order0 != list(range(8)) and stream._pass_order(1) != order0  # shuffled, anew each pass
    first_seen = list(dict.fromkeys(s[0] for s in both[:30]))
    assert first_seen == [f"s{k}" for k in order0][:len(first_seen)]  # read in that order
    assert [s[0] for s in _read_all(d)[0]][::5] == [f"s{k}" for k in range(8)]  # no shuffling: corpus order

    # the shard order is part of the position: a JSON round-trip mid-pass continues identically
    a = SentenceStream(d, n_epochs=2, shuffle_buffer=2, seed=7)
    head = [a.next_sentence() for _ in range(13)]
    b = SentenceStream(d, n_epochs=2, shuffle_buffer=2, seed=99)  # another seed: the state decides
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert head + [b.next_sentence() for _ in range(67)] == both
