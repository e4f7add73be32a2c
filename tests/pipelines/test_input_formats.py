"""``elmo embed``'s inputs besides Parquet: CSV, TSV, JSON Lines and text, each giving the vectors
the same sentences give from Parquet, resumed and pinned as Parquet is; a file the readers cannot
read, or whose format its name does not tell, refused before anything is written."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipelines import embed_parquet
from pipelines.verify import verify_output

from tests.helpers import run_cli as elmo

SENTENCES = ["The cat sat on the mat .", 'He said "yes , of course" .', "Green ideas sleep .", "",
             "A fourth , with commas , row", "Ünïcode wörds here", "the last one"]
IDS = list(range(10, 10 + len(SENTENCES)))


def write_inputs(where: Path) -> dict[str, Path]:
    where.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": pa.array(IDS, pa.int64()), "text": SENTENCES})
    pq.write_table(table, where / "in.parquet")
    pa_csv.write_csv(table, where / "in.csv")
    (where / "in.tsv").write_text("id\ttext\n" + "".join(f"{i}\t{s}\n" for i, s in zip(IDS, SENTENCES)))
    (where / "in.jsonl").write_text("".join(json.dumps({"id": i, "text": s}) + "\n" for i, s in zip(IDS, SENTENCES)))
    (where / "in.txt").write_text("".join(s + "\n" for s in SENTENCES))
    return {p.suffix[1:]: p for p in where.iterdir()}


def vectors(out: Path) -> list:
    return ds.dataset(out, format="parquet").to_table().column("elmo").to_pylist()


def test_csv_tsv_jsonl_and_text_give_the_vectors_of_the_same_rows_from_parquet(tiny_dir, tmp_path):
    inputs = write_inputs(tmp_path / "in")
    expected = None
    for kind in ("parquet", "csv", "tsv", "jsonl", "txt"):
        out = tmp_path / f"out-{kind}"
        ids = [] if kind == "txt" else ["--id-column", "id"]
        r = elmo("embed", "--text", inputs[kind], "--out", out, "--model", tiny_dir, "--rows-per-shard", "3", "--quiet", *ids)
        assert r.returncode == 0, (kind, r.stderr)
        table = ds.dataset(out, format="parquet").to_table()
        assert table.num_rows == len(SENTENCES) and len(list(out.glob("part-*.parquet"))) == 3
        if ids:  # a CSV/TSV field is the text it holds
            assert table.column("id").to_pylist() == ([str(i) for i in IDS] if kind in ("csv", "tsv") else IDS)
        got = table.column("elmo").to_pylist()
        expected = expected or got
        assert [len(v) for v in got] == [len(v) for v in expected]
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
        assert verify_output(out)["inputs_checked"] == 1


def test_csv_and_tsv_columns_hold_the_characters_of_their_fields(tiny_dir, tmp_path):
    """pyarrow inferred a CSV column's type: the id 007 became 7 (the same as the id 7), an id past
    int64 made the column float64 (20 digits rounded), and files whose columns it typed apart were
    refused. Every column is now a string: the file's characters, an empty field "" (as the text
    column's), whatever the other rows or files hold."""
    ids = ["007", "7", "12345678901234567890", "9223372036854775809", "-0", "1e3"]
    kept = ["1", "", "2.5", "NA", "true", "null"]
    for name, sep in (("in.csv", ","), ("in.tsv", "\t")):
        path = tmp_path / name
        path.write_text(f"id{sep}n{sep}text\n" + "".join(f"{i}{sep}{k}{sep}row {i}\n" for i, k in zip(ids, kept)))
        out = tmp_path / f"out-{name}"
        r = elmo("embed", "--text", path, "--out", out, "--model", tiny_dir, "--quiet", "--id-column", "id",
                 "--keep-columns", "n")
        assert r.returncode == 0, r.stderr
        table = pq.read_table(out)
        assert table.schema.field("id").type == pa.string() and table.schema.field("n").type == pa.string()
        assert table.column("id").to_pylist() == ids and table.column("n").to_pylist() == kept
        assert verify_output(out)["rows"] == len(ids)
    (tmp_path / "two").mkdir()  # ints in one file, text in the other; an empty column beside floats
    (tmp_path / "two" / "a.csv").write_text("id,n,text\n1,,a b\n2,,c\n")
    (tmp_path / "two" / "b.csv").write_text("id,n,text\nx1,0.5,d e\n")
    r = elmo("embed", "--text", tmp_path / "two", "--out", tmp_path / "out-two", "--model", tiny_dir, "--quiet",
             "--id-column", "id", "--keep-columns", "n")
    assert r.returncode == 0, r.stderr
    table = ds.dataset(tmp_path / "out-two").to_table()
    assert table.column("id").to_pylist() == ["1", "2", "x1"] and table.column("n").to_pylist() == ["", "", "0.5"]


def test_a_json_lines_integer_pyarrow_would_round_is_refused_naming_its_line_and_key(tiny_dir, tmp_path,
                                                                                     monkeypatch):
    """pyarrow read an integer past int64 as a double (123456789012345678901 became
    1.2345678901234568e+20) and one past 2**53 in a key that also holds floats rounded, silently;
    the largest int64 is kept exact."""
    exact = tmp_path / "exact.jsonl"
    exact.write_text('{"id": 9223372036854775807, "text": "a b 12345678901234567890"}\n{"id": -5, "text": "c"}\n')
    r = elmo("embed", "--text", exact, "--out", tmp_path / "out", "--model", tiny_dir, "--quiet", "--id-column", "id")
    assert r.returncode == 0, r.stderr
    assert pq.read_table(tmp_path / "out").column("id").to_pylist() == [9223372036854775807, -5]
    for name, content, message, *flags in (
            ("big.jsonl", '{"id": 1, "text": "a"}\n\n{"id": 123456789012345678901, "text": "b"}\n',
             "big.jsonl: line 3: key 'id' holds the integer 123456789012345678901, beyond a 64-bit integer"),
            ("nested.jsonl", '{"id": 1, "v": [1, 2], "text": "a"}\n'
                             '{"id": 2, "v": [18446744073709551616], "text": "b"}\n',
             "nested.jsonl: line 2: key 'v' holds the integer 18446744073709551616", "--keep-columns", "v"),
            ("mixed.jsonl", '{"id": 0.5, "text": "a"}\n{"id": 9007199254740993, "text": "b"}\n',
             "mixed.jsonl: line 2: key 'id' holds the integer 9007199254740993, in a key that holds numbers with a "
             "fraction too")):
        (tmp_path / name).write_text(content)
        out = tmp_path / f"out-{name}"
        r = elmo("embed", "--text", tmp_path / name, "--out", out, "--model", tiny_dir, "--id-column", "id", *flags)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert message in r.stderr and 'write it as a JSON string ("' in r.stderr, r.stderr
        assert not out.exists()
    r = elmo("embed", "--text", tmp_path / "nested.jsonl", "--out", tmp_path / "out-not-kept", "--model", tiny_dir,
             "--quiet", "--id-column", "id")  # a key the job does not copy is not read for its values
    assert r.returncode == 0 and pq.read_table(tmp_path / "out-not-kept").column_names == ["id", "elmo"], r.stderr
    (tmp_path / "retyped.jsonl").write_text('{"id": 1, "v": 123456789012345678901, "text": "a"}\n'
                                           '{"id": 2, "v": 1, "text": 5}\n')  # the file's fault is line 2's
    r = elmo("embed", "--text", tmp_path / "retyped.jsonl", "--out", tmp_path / "out-retyped", "--model", tiny_dir,
             "--id-column", "id")
    assert r.returncode == 2 and "line 2: column 'text' holds a number where earlier lines hold a string" in r.stderr, \
        r.stderr
    import pipelines.input_bytes as input_bytes
    from elmo_core.errors import InputError

    monkeypatch.setattr(input_bytes, "BLOCK_BYTES", 2048)  # a file of several blocks: typed from every line
    big = tmp_path / "blocks.jsonl"
    big.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(200))
                   + '{"id": 99999999999999999999, "text": "last"}\n')
    with pytest.raises(InputError, match=r"blocks.jsonl: line 201: key 'id' holds the integer 99999999999999999999"):
        embed_parquet(big, tmp_path / "out-blocks", tiny_dir, id_column="id", quiet=True)


@pytest.mark.parametrize("name, content, message", [
    ("bad.txt", b"fine\nnot \xff here\n", "bad.txt: line 2 is not UTF-8"),
    ("text.csv", b"id,text\n1,a b\n2,not \xff here\n", "text.csv: record 3 (the header is record 1), column 'text' "
                                                        "is not UTF-8"),
    ("kept.csv", b"id,text\n1\xff,a b\n", "kept.csv: record 2 (the header is record 1), column 'id' is not UTF-8"),
    ("header.tsv", b"id\tte\xffxt\n1\ta b\n", "header.tsv: record 1 (the header), a column name is not UTF-8"),
    # pyarrow kept the bytes in its strings: the text's dropped and counted, a kept column's written as they were
    ("value.jsonl", b'{"text": "a b"}\n\n{"text": "not \xff here"}\n', "value.jsonl: line 3 is not UTF-8"),
    ("key.jsonl", b'{"text": "a b", "i\xffd": 1}\n', "key.jsonl: line 1 is not UTF-8"),
])
def test_bytes_that_are_not_utf8_are_refused_alike_in_text_csv_tsv_and_json_lines(tiny_dir, tmp_path, name, content,
                                                                                 message):
    (tmp_path / name).write_bytes(content)
    out = tmp_path / "out"
    r = elmo("embed", "--text", tmp_path / name, "--out", out, "--model", tiny_dir)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert message in r.stderr and "INPUT is UTF-8 text: convert the file" in r.stderr, r.stderr
    assert not out.exists()


def test_a_csv_job_resumes_its_damaged_shard_and_is_pinned_to_the_csv(tiny_dir, tmp_path):
    csv = write_inputs(tmp_path / "in")["csv"]
    out = tmp_path / "out"
    opts = dict(id_column="id", rows_per_shard=3, quiet=True)
    embed_parquet(csv, out, tiny_dir, **opts)
    first = vectors(out)
    victim = out / "part-00000-00001.parquet"
    victim.write_bytes(victim.read_bytes()[:-200])
    m = embed_parquet(csv, out, tiny_dir, resume=True, **opts)
    assert m["this_run"]["shards"] == 1 and m["this_run"]["shards_kept"] == 2
    assert vectors(out) == first
    csv.write_text(csv.read_text().replace("the last one", "another last one"))
    r = elmo("embed", "--text", csv, "--out", out, "--model", tiny_dir, "--id-column", "id", "--rows-per-shard", "3", "--resume")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert vectors(out) == first


@pytest.mark.parametrize("name, content, message", [
    ("bad.csv", "id,text\n1,a b\n2,c,d\n3,e\n", "bad.csv: record 3 (the header is record 1): 3 fields where the header has 2"),
    ("bad.tsv", "id\ttext\n1\ta b\n2\tc\td\n", "bad.tsv: record 3 (the header is record 1): 3 fields where the header has 2"),
    ("bad.jsonl", '{"text": "a b"}\n{"text": "c"}\n{text: 1}\n', "bad.jsonl: line 3 is not JSON"),
    ("typed.jsonl", '{"text": "a b"}\n{"text": 3}\n', "typed.jsonl: line 2: column 'text' holds a number where "
                                                      "earlier lines hold a string"),
    ("open.csv", 'id,text\n1,"a b\n2,c d\n', 'open.csv: row 1: a quote opens its last field and never closes'),
    ("cols.csv", "id,sentence\n1,a b\n", "cols.csv: columns ['text'] not found; the columns are ['id', 'sentence']"),
    ("cols.jsonl", '{"id": 1, "sentence": "a"}\n', "cols.jsonl: columns ['text'] not found"),
    # pyarrow reads two objects on one line as two rows: row numbers would stop being line numbers
    ("two.jsonl", '{"text": "a b"}\n{"text": "c"} {"text": "d"}\n\n{"text": "e"}', "two.jsonl: line 2 is not JSON "
                                                                                   "(Extra data"),
    ("header.csv", 'text,"unclosed\nx,y\n', "header.csv: no record of it ends: a quote opens in its header"),
    ("null.jsonl", '{"text": "a"}\nnull\n', "null.jsonl: line 2 is a JSON null, not an object"),  # not a row of nulls
    ("twice.jsonl", '{"text": "x"}\n\n{"text": "y"}\n{"text": "a", "text": "b"}\n',
     "twice.jsonl: line 4: key 'text' appears twice"),  # pyarrow's own row counts from its block, blank lines not
    ("corpus.txt.gz", "a b\n", "a compressed file is not read: decompress it"),
    ("corpus.dat", "a b\n", "corpus.dat: cannot tell its input format from its name; elmo embed reads parquet "
                            "(.parquet, .parq, .pq); csv (.csv); tsv (.tsv); jsonl (.jsonl, .ndjson); text (.txt)"),
])
def test_a_file_that_cannot_be_read_or_told_is_refused_before_anything_is_written(tiny_dir, tmp_path, name,
                                                                                   content, message):
    (tmp_path / name).write_text(content)
    out = tmp_path / "out"
    r = elmo("embed", "--text", tmp_path / name, "--out", out, "--model", tiny_dir)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert message in r.stderr
    assert not out.exists()


def test_csv_headers_ended_by_a_lone_cr_or_holding_a_quoted_line_break_are_read(tiny_dir, tmp_path):
    """The header decides whether blank lines are rows (one column): it ends where pyarrow's first
    record does, at a lone CR too, and a quoted name may hold a line break."""
    for name, content, texts in (("cr.csv", "text\ra b\r\rc\r", ["a b", "", "c"]),
                                 ("crs.csv", "id,text\r1,a b\r2,c\r", ["a b", "c"]),
                                 ("quoted.csv", '"i\nd",text\n1,a\n\n2,b\n', ["a", "b"])):
        (tmp_path / name).write_bytes(content.encode())
        out = tmp_path / f"out-{name}"
        r = elmo("embed", "--text", tmp_path / name, "--out", out, "--model", tiny_dir, "--quiet",
                 "--keep-columns", "text")
        assert r.returncode == 0, r.stderr
        assert pq.read_table(out, columns=["text"]).column("text").to_pylist() == texts


def test_a_last_field_whose_closed_quote_holds_a_line_break_is_read(tiny_dir, tmp_path):
    """It was refused as a quote that never closes (pyarrow reads it): the value alone ends with a
    line break either way."""
    for name, content, last in (("nl.csv", 'id,text\n1,"x"\n2,"ends\n"\n', "ends\n"),
                                ("esc.csv", 'id,text\n1,x\n2,"a ""b""\n"', 'a "b"\n')):
        (tmp_path / name).write_text(content)
        out = tmp_path / f"out-{name}"
        r = elmo("embed", "--text", tmp_path / name, "--out", out, "--model", tiny_dir, "--quiet")
        assert r.returncode == 0, r.stderr
        assert verify_output(out)["rows"] == 2 and len(vectors(out)[-1]) == len(last.split())


def test_a_type_that_changes_after_the_first_block_is_read(tiny_dir, tmp_path, monkeypatch):
    """Valid files of several blocks were refused where a later block did not fit the types the
    first one gave (a column empty, then text; a key that appears late; null, then a string; ints,
    then floats): a CSV column is strings throughout, a JSON Lines key typed from every line."""
    import pipelines.input_bytes as input_bytes

    monkeypatch.setattr(input_bytes, "BLOCK_BYTES", 2048)  # blocks of a few dozen rows (4 MiB in a job)
    n = 300
    csv = tmp_path / "in.csv"
    csv.write_text("id,a,n,text\n" + "".join(f"{i},,{i},row {i}\n" for i in range(n)) + f"{n},late,1.5,last row\n")
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "text": f"row {i}", "x": None}) + "\n" for i in range(n))
                     + json.dumps({"id": n, "text": "last row", "x": "late", "new": 2.5}) + "\n")
    for path, kept, ids, first, last in (
            (csv, ["a", "n"], [str(i) for i in range(n + 1)], {"a": "", "n": "0"}, {"a": "late", "n": "1.5"}),
            (jsonl, ["x", "new"], list(range(n + 1)), {"x": None, "new": None}, {"x": "late", "new": 2.5})):
        out = tmp_path / f"out-{path.suffix[1:]}"
        m = embed_parquet(path, out, tiny_dir, id_column="id", keep_columns=kept, quiet=True)
        table = ds.dataset(out).to_table()
        assert m["rows"] == n + 1 and table.column("id").to_pylist() == ids
        assert {k: table.column(k)[0].as_py() for k in kept} == first
        assert {k: table.column(k)[-1].as_py() for k in kept} == last


def test_every_line_is_a_row_in_every_door(tiny_dir, tmp_path):
    """A blank line of a one-column CSV/TSV was dropped (pyarrow skips empty lines: every later row
    moved, verify said OK); a lone CR ended a .txt line for --format hdf5 only; a byte-order mark
    stayed in a .txt's first token."""
    import h5py

    cases = {"blank.tsv": ("text\nHello there\n\nWorld\n", [2, 0, 1]),
             "blank.csv": ("text\nHello there\n\nWorld\n", [2, 0, 1]),
             "two.csv": ("id,text\n1,Hello there\n\n2,World\n\n", [2, 1]),  # several columns: a blank line is no row
             "cr.txt": ("Hello there\rGood bye\nThird line\n", [2, 2, 2]),
             "bom.txt": ("\ufeffHello there\nmore\n", [2, 1])}
    for name, (content, tokens) in cases.items():
        (tmp_path / name).write_bytes(content.encode())
        out = tmp_path / f"out-{name}"
        r = elmo("embed", "--text", tmp_path / name, "--out", out, "--model", tiny_dir, "--quiet")
        assert r.returncode == 0, r.stderr
        assert [len(v or []) for v in ds.dataset(out).to_table().column("elmo").to_pylist()] == tokens, name
        if name.endswith(".txt"):
            r = elmo("embed", "--text", tmp_path / name, "--out", tmp_path / f"{name}.hdf5", "--format", "hdf5",
                     "--model", tiny_dir, "--quiet")
            assert r.returncode == 0, r.stderr
            with h5py.File(tmp_path / f"{name}.hdf5") as f:
                index = json.loads(f["sentence_to_index"][0])
                assert [f[str(k)].shape[0] for k in range(len(tokens))] == tokens and "Hello there" in index, index


@pytest.mark.parametrize("name", ["empty.csv", "empty.jsonl", "empty.txt"])
def test_an_empty_file_of_any_format_is_zero_rows(tiny_dir, tmp_path, name):
    """An empty .jsonl was refused ("Empty JSON stream", pyarrow's newer words) where .csv and .txt gave 0 rows."""
    (tmp_path / name).write_text("")
    r = elmo("embed", "--text", tmp_path / name, "--out", tmp_path / "out", "--model", tiny_dir, "--quiet")
    assert r.returncode == 0, r.stderr
    assert verify_output(tmp_path / "out")["rows"] == 0


def test_a_directory_of_parquet_files_says_which_other_files_it_does_not_read(tiny_dir, tmp_path):
    """Its Parquet files are its input (a dataset's directory may hold notes); the others were left
    out without a word."""
    write_inputs(tmp_path / "in")  # one file of each format
    r = elmo("embed", "--text", tmp_path / "in", "--out", tmp_path / "out", "--model", tiny_dir)
    assert r.returncode == 0, r.stderr
    assert f"INPUT {tmp_path / 'in'}: its 1 Parquet file(s) are read, not its 4 file(s) of other formats" in r.stderr
    assert len(vectors(tmp_path / "out")) == len(SENTENCES)


def test_a_directory_reads_its_one_format_and_refuses_a_mix(tiny_dir, tmp_path):
    inputs = write_inputs(tmp_path / "in")
    for kind in ("parquet", "tsv", "txt", "jsonl"):
        inputs[kind].unlink()
    r = elmo("embed", "--text", tmp_path / "in", "--out", tmp_path / "out", "--model", tiny_dir, "--quiet")
    assert r.returncode == 0, r.stderr
    assert len(vectors(tmp_path / "out")) == len(SENTENCES)
    (tmp_path / "in" / "more.jsonl").write_text('{"text": "a b"}\n')
    r = elmo("embed", "--text", tmp_path / "in", "--out", tmp_path / "out2", "--model", tiny_dir)
    assert r.returncode == 2 and "files of several input formats (csv, jsonl)" in r.stderr, r.stderr


def test_a_directory_reads_through_links_to_folders_once_each(tmp_path):
    """A linked folder was skipped without a word; a link that loops back is not read again."""
    from corpora.files import input_files

    (tmp_path / "in" / "own").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    for path in (tmp_path / "in" / "own" / "a.txt", tmp_path / "elsewhere" / "b.txt"):
        path.write_text("a b\n")
    (tmp_path / "in" / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "in" / "again").symlink_to(tmp_path / "elsewhere")  # the same folder: read once
    (tmp_path / "in" / "own" / "loop").symlink_to(tmp_path / "in")
    (tmp_path / "in" / ".snapshot").symlink_to(tmp_path / "in" / "own")  # hidden: neither entered nor claiming own
    (tmp_path / "in" / "alias").symlink_to(tmp_path / "in" / "own")  # sorts before own: own is read as itself
    found = [str(Path(p).relative_to(tmp_path / "in")) for p, _ in input_files(tmp_path / "in")]
    assert found == ["again/b.txt", "own/a.txt"]  # a folder outside through the first link by name


def test_a_jobs_expected_tokens_come_from_its_inputs_footers_and_sizes(tmp_path):
    """Each input file's ``expected_tokens`` (what a compiled layout's warm-up is weighed against),
    read before the model loads: a Parquet text column's bytes / 6 from its footer, a tokens
    column's values, another format's whole file's bytes / 6, at least one a row; within a factor
    of the tokens there are on real English."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpora.sample import write_sample_corpus
    from elmo_core.whitespace import split_tokens
    from pipelines.options import EmbedOptions
    from pipelines.source import BYTES_PER_TOKEN, file_tokens, parquet_tokens, scan_inputs

    paths = write_sample_corpus(tmp_path / "corpus", rows=500, files=2, row_group_rows=100)
    texts = [t for p in paths for t in pq.read_table(p, columns=["text"])["text"].to_pylist()]
    tokens = sum(len(split_tokens(t)) for t in texts)
    files = scan_inputs(tmp_path / "corpus", EmbedOptions())
    assert [f.expected_tokens for f in files] == [parquet_tokens(pq.ParquetFile(p).metadata, "text") for p in paths]
    assert 0.7 * tokens < sum(f.expected_tokens for f in files) < 1.1 * tokens
    (tmp_path / "lines.txt").write_text("".join(t + "\n" for t in texts))
    [txt] = scan_inputs(tmp_path / "lines.txt", EmbedOptions())
    assert txt.expected_tokens == (tmp_path / "lines.txt").stat().st_size // BYTES_PER_TOKEN
    assert 0.7 * tokens < txt.expected_tokens < 1.1 * tokens
    assert file_tokens(size=60, rows=20) == 20  # at least one a row
    pq.write_table(pa.table({"toks": [t.split() for t in texts]}), tmp_path / "toks.parquet")  # words repeat: a dictionary
    listed = pq.ParquetFile(tmp_path / "toks.parquet").metadata
    assert parquet_tokens(listed, "toks") == tokens
    [toks] = scan_inputs(tmp_path / "toks.parquet", EmbedOptions(tokens_column="toks"))
    assert toks.expected_tokens == tokens
    pq.write_table(pa.table({"text": ["the same thirty bytes of text."] * 20_000}), tmp_path / "same.parquet")
    same = pq.ParquetFile(tmp_path / "same.parquet").metadata  # one dictionary entry: a few bytes of encoding
    assert parquet_tokens(same, "text") == 20_000  # at least one a row
