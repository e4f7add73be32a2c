"""OUTPUT_DIR and INPUT on an object store under a hostile or unlucky user (issue #47), against a
real S3 server on 127.0.0.1 (moto's): URIs spelled with '//' or '..' name the same objects in
`elmo embed` and `elmo verify`; a refused OUTPUT_DIR leaves no lock object; an input object
rewritten with the same size is seen by its ETag."""
from __future__ import annotations

import pytest

from corpora.sample import write_sample_corpus
from elmo_cli.main import main
from elmo_core.errors import InputError
from pipelines.options import EmbedOptions
from pipelines.source import scan_inputs
from tests.pipelines.store_utils import upload

RUN = ["--id-column", "id", "--rows-per-shard", "50", "--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def corpus(s3, tmp_path_factory):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("hostile-store") / "corpus"
    write_sample_corpus(path, rows=100, files=1, row_group_rows=50)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory):  # type: ignore[no-untyped-def]
    from tests.helpers import TINY_OPTIONS, make_model_dir
    return make_model_dir(tmp_path_factory.mktemp("hostile-store") / "tiny", TINY_OPTIONS)


def _keys(s3, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    import pyarrow.fs as pafs
    infos = s3.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
    return sorted(i.path[len(prefix) + 1:] for i in infos if i.is_file)


@pytest.mark.parametrize("spelled, objects", [("s3://odd//dbl/", "odd/dbl"), ("s3://odd/x/../out", "odd/out"),
                                              ("s3://odd/./dot//", "odd/dot")])
def test_embed_and_verify_name_the_same_objects_however_the_uri_is_spelled(s3, corpus, model, capsys, spelled,
                                                                           objects):
    s3.create_dir("odd")
    assert main(["embed", "--text", str(corpus), "--out", spelled, "--model", str(model), *RUN]) == 0
    assert {"_SUCCESS", "part-00000-00000.parquet", "part-00000-00001.parquet"} <= set(_keys(s3, objects))
    capsys.readouterr()
    assert main(["verify", "--out", spelled]) == 0, capsys.readouterr().err
    assert main(["verify", "--out", f"s3://{objects}"]) == 0


def test_a_uri_above_its_bucket_is_refused(s3, corpus, model, capsys):
    assert main(["embed", "--text", str(corpus), "--out", "s3://odd/../other", "--model", str(model), *RUN]) == 2
    assert "'..' goes above the bucket odd" in capsys.readouterr().err


@pytest.mark.parametrize("out", ["s3://refused", "s3://refused/corpus", "s3://refused/corpus/vectors",
                                 "s3://refused/full"])
def test_a_refused_output_dir_on_the_store_leaves_no_lock_object(s3, corpus, model, capsys, out):
    s3.create_dir("refused")
    source = upload(s3, corpus, "refused/corpus")
    with s3.open_output_stream("refused/full/notes.txt") as f:
        f.write(b"someone else's")
    before = _keys(s3, "refused")
    assert main(["embed", "--text", source, "--out", out, "--model", str(model), *RUN]) == 2
    err = capsys.readouterr().err
    assert any(m in err for m in ("inside OUTPUT_DIR", "is inside INPUT", "is not empty")), err
    assert _keys(s3, "refused") == before  # nothing written: no .elmo.lock either


def test_an_input_object_rewritten_with_the_same_size_is_seen_by_its_etag(s3, corpus):
    s3.create_dir("pinned")
    source = upload(s3, corpus, "pinned/corpus")
    (file,) = scan_inputs(source, EmbedOptions())
    assert file.etag is not None
    file.check_unchanged()
    data = s3.open_input_stream("pinned/corpus/corpus-00000.parquet").read()
    with s3.open_output_stream("pinned/corpus/corpus-00000.parquet") as f:  # within the second: the same mtime
        f.write(data[:100] + bytes([data[100] ^ 1]) + data[101:])  # the same size, another byte
    with pytest.raises(InputError, match="changed while the job ran"):
        file.check_unchanged()
