"""``elmo embed`` with the local engine: vectors against the Embedder, schema, order, readers, bad input."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from elmo_cli.main import main
from elmo_core.errors import InputError
from storage.locations import GrowingFileDigest, file_sha256
from inference import Embedder
from pipelines import ElmoPredictor, OutputDirError, embed_parquet
from corpora.sample import write_sample_corpus
from inference.batching import window_spans
from pipelines.verify import verify_output

from tests.helpers import read_record

ATOL = 1e-5  # float32 paths with other batch compositions (GEMM blocking) and float16 round trips excluded
FAST = dict(max_tokens_per_batch=2048, sort_window_rows=64, quiet=True)


def rows_of(out: Path) -> pa.Table:
    return ds.dataset(out, format="parquet").to_table()


def check_against_embedder(table: pa.Table, texts: list, model: Path, output: str = "mixed", atol: float = ATOL):
    ref = Embedder.from_files(model).embed_sentences([t.split() for t in texts if t is not None], output=output)
    refs = iter(ref)
    for i, (text, got) in enumerate(zip(texts, table.column("elmo").to_pylist())):
        if text is None:
            assert got is None, f"row {i}: null text must give a null vector"
            continue
        want = next(refs)
        want = want.transpose(1, 0, 2) if output == "all" else want  # (T, L+1, D)
        got = np.asarray(got, dtype=np.float32).reshape(want.shape)
        np.testing.assert_allclose(got, want, atol=atol, rtol=0, err_msg=f"row {i}")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus")
    write_sample_corpus(path, rows=160, files=2, row_group_rows=50)
    return path


def test_spans_cover_each_token_once_with_context():
    for n, m, c in [(10, 4, 0), (100, 16, 2), (257, 256, 32), (1000, 256, 32), (33, 8, 3), (9, 5, 2)]:
        spans = window_spans(n, m, c)
        kept = [i for s in spans for i in range(s.keep_from, s.keep_to)]
        assert kept == list(range(n))
        for s in spans:
            assert 0 <= s.start <= s.keep_from < s.keep_to <= s.end <= n and s.end - s.start <= m
            assert s.keep_from == 0 or s.keep_from - s.start >= c
            assert s.keep_to == n or s.end - s.keep_to >= c


@pytest.mark.parametrize("output,dtype", [("mixed", "float32"), ("all", "float32"), ("top", "float16")])
def test_local_vectors_match_embedder(corpus, tiny_dir, tmp_path, output, dtype):
    out = tmp_path / "out"
    m = embed_parquet(corpus, out, tiny_dir, id_column="id", keep_columns=["speech"], output=output, dtype=dtype,
                      rows_per_shard=30, **FAST)
    table = rows_of(out)
    source = ds.dataset(corpus, format="parquet").to_table()
    assert table.column_names == ["id", "speech", "elmo"]
    assert table.column("id").to_pylist() == source.column("id").to_pylist()
    assert m["rows"] == 160 and m["tokens"] == sum(len(t.split()) for t in source.column("text").to_pylist())
    D = 16
    inner = table.schema.field("elmo").type.value_type
    assert pa.types.is_fixed_size_list(inner)
    if output == "all":
        assert inner.list_size == 3 and inner.value_type.list_size == D
    else:
        assert inner.list_size == D and inner.value_type == (pa.float16() if dtype == "float16" else pa.float32())
    check_against_embedder(table, source.column("text").to_pylist(), tiny_dir, output,
                           # float16 output: 2**-11 relative rounding at |x| <~ 4
                           atol=2e-3 if dtype == "float16" else ATOL)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("part-")) == \
        ["_SUCCESS", "_job.parquet", "_manifest.parquet", "_shards"]  # a finished output keeps no lock file
    assert sorted(p.name for p in (out / "_shards").iterdir()) == sorted(p.name for p in out.glob("part-*.parquet"))
    assert len(m["shards"]) == 6  # 80 rows a file, 30 rows a shard


def test_windows_are_bounded_by_tokens_and_cover_each_row_once(corpus):
    """Each sort window holds at most ``sort_window_tokens`` tokens (a longer single row alone) and
    ``sort_window_rows`` rows, spans shards where they end inside it, and the windows give every
    row of the file once, in order, each piece to its shard, each shard's last rows marked once."""
    from pipelines.options import EmbedOptions
    from pipelines.source import read_windows, scan_inputs, shards_of

    opts = EmbedOptions.coerce(id_column="id", sort_window_rows=64, sort_window_tokens=200, rows_per_shard=30)
    spanning = 0
    for file in scan_inputs(corpus, opts):
        shards = shards_of([file], opts.rows_per_shard)
        windows = list(read_windows(file, shards, opts, span=True))
        ids, per_shard, lasts = [], {}, []
        for w in windows:
            counts = [len(t.split()) for t in w.table.column("text").to_pylist()]
            assert sum(counts) <= 200 or len(counts) == 1, counts
            assert w.table.num_rows <= 64 and w.table.num_rows == sum(p.rows for p in w.pieces)
            ids += w.table.column("id").to_pylist()
            for p in w.pieces:
                assert p.rows > 0 and p.shard.start + per_shard.get(p.shard.chunk, 0) + p.rows <= p.shard.start + p.shard.rows
                per_shard[p.shard.chunk] = per_shard.get(p.shard.chunk, 0) + p.rows
                lasts += [p.shard.chunk] if p.last else []
                assert p.last == (per_shard[p.shard.chunk] == p.shard.rows)
            spanning += len(w.pieces) > 1
        whole = pq.read_table(file.path)
        assert ids == whole.column("id").to_pylist()
        assert per_shard == {s.chunk: s.rows for s in shards}
        assert lasts == [s.chunk for s in shards]
        assert len(windows) > len(shards)  # the token bound cut windows inside shards
    assert spanning > 0  # and some windows went on past a shard's end


def test_a_window_spans_shards_so_the_batches_do_not_shrink_with_them(corpus):
    """Shards of 5 rows, windows of up to 64: the windows (and so the model's batches) are those
    of one shard a file, each cut into its shards' pieces; a resume reads the same windows, the
    rows of a committed shard in a piece of no shard, and skips a window with none it asks for.
    A cluster's task (``span`` off) keeps its windows within its shard."""
    from pipelines.options import EmbedOptions
    from pipelines.source import read_windows, scan_inputs, shards_of

    big = EmbedOptions.coerce(id_column="id", sort_window_rows=64, sort_window_tokens=10**6, rows_per_shard=10**6)
    small = EmbedOptions.coerce(id_column="id", sort_window_rows=64, sort_window_tokens=10**6, rows_per_shard=5)
    file = scan_inputs(corpus, big)[0]
    one = [w.table.num_rows for w in read_windows(file, shards_of([file], big.rows_per_shard), big)]
    shards = shards_of([file], small.rows_per_shard)
    cut = list(read_windows(file, shards, small, span=True))
    assert [w.table.num_rows for w in cut] == one
    assert [w.start for w in cut] == [sum(one[:k]) for k in range(len(one))]
    assert [len(w.pieces) for w in cut] == [-(-n // 5) for n in one]  # 64 rows: 13 shards' pieces
    kept = [s for s in shards if s.chunk != 2 and s.start >= one[0] or s.chunk == 0]  # 1.. in window 0 committed
    resumed = list(read_windows(file, kept, small, span=True))
    assert [w.start for w in resumed] == [w.start for w in cut]
    assert [w.table.num_rows for w in resumed] == one
    assert [p.shard is None for p in resumed[0].pieces] == [False] + [True]  # shards 1..12 in one dropped piece
    later = [s for s in shards if s.start >= one[0]]  # window 0 done whole: not read as a window
    assert [w.start for w in read_windows(file, later, small, span=True)] == [w.start for w in cut[1:]]
    alone = list(read_windows(file, [shards[3]], small))
    assert [(w.start, w.table.num_rows, [(p.shard.chunk, p.rows, p.last) for p in w.pieces]) for w in alone] == \
        [(15, 5, [(3, 5, True)])]


def test_token_bound_of_windows_does_not_change_vectors(corpus, tiny_dir, tmp_path):
    small, large = tmp_path / "small", tmp_path / "large"
    embed_parquet(corpus, small, tiny_dir, id_column="id", sort_window_tokens=50, **FAST)
    embed_parquet(corpus, large, tiny_dir, id_column="id", sort_window_tokens=100_000, **FAST)
    a, b = rows_of(small), rows_of(large)
    assert a.column("id").equals(b.column("id"))
    for i, (x, y) in enumerate(zip(a.column("elmo").to_pylist(), b.column("elmo").to_pylist())):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=ATOL, rtol=0, err_msg=f"row {i}")


def test_duckdb_reads_output_in_input_order(corpus, tiny_dir, tmp_path):
    duckdb = pytest.importorskip("duckdb", reason="duckdb is in the dev extra")
    out = tmp_path / "out"
    embed_parquet(corpus, out, tiny_dir, id_column="id", rows_per_shard=25, **FAST)
    got = duckdb.sql(f"SELECT id, len(elmo) AS n FROM read_parquet('{out}/*.parquet')").fetchall()
    source = ds.dataset(corpus, format="parquet").to_table()
    assert [g[0] for g in got] == source.column("id").to_pylist()
    assert [g[1] for g in got] == [len(t.split()) for t in source.column("text").to_pylist()]


def test_null_empty_long_tokens_and_windows(tiny_dir, tmp_path):
    long_row = " ".join(f"w{i % 23}" for i in range(70))
    texts = ["a normal row .", None, "", "   \t ", "é" * 40 + " " + "x" * 80 + " ok", long_row, "last"]
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), tmp_path / "in.parquet")
    out = tmp_path / "out"
    m = embed_parquet(tmp_path / "in.parquet", out, tiny_dir, id_column="id", max_sentence_length=16,
                      window_context=2, **FAST)
    got = rows_of(out).column("elmo").to_pylist()
    assert got[1] is None and got[2] == [] and got[3] == []
    assert len(got[4]) == 3 and len(got[5]) == 70
    assert m["null_rows"] == 1 and m["windowed_rows"] == 1
    assert m["windows"] == len(window_spans(70, 16, 2)) == 6
    short = [t if t is None or len(t.split()) <= 16 else "" for t in texts]
    short_table = pa.table({"elmo": pa.array([g if t != long_row else [] for g, t in zip(got, texts)])})
    check_against_embedder(short_table, short, tiny_dir)
    # a windowed row: each window is embedded alone; the first window's kept tokens are its first 14
    tokens = long_row.split()
    first = Embedder.from_files(tiny_dir).embed_sentences([tokens[:16]], output="mixed")[0]  # (16, D)
    np.testing.assert_allclose(np.asarray(got[5][:14], np.float32), first[:14], atol=ATOL, rtol=0)
    second = Embedder.from_files(tiny_dir).embed_sentences([tokens[12:28]], output="mixed")[0]
    np.testing.assert_allclose(np.asarray(got[5][14:26], np.float32), second[2:14], atol=ATOL, rtol=0)


def test_tokens_column_and_mix(tiny_dir, tmp_path):
    tokens = [["The", "cat", "sat"], None, [], ["Hi"]]
    pq.write_table(pa.table({"toks": pa.array(tokens, pa.list_(pa.string()))}), tmp_path / "in.parquet")
    embed_parquet(tmp_path / "in.parquet", tmp_path / "out", tiny_dir, tokens_column="toks", mix=[1.0, -1.0, 0.5],
                  gamma=0.7, **FAST)
    got = rows_of(tmp_path / "out").column("elmo").to_pylist()
    assert got[1] is None and got[2] == []
    want = Embedder.from_files(tiny_dir).embed_sentences([tokens[0], tokens[3]], output="mixed",
                                                         mix_weights=[1.0, -1.0, 0.5], gamma=0.7)
    np.testing.assert_allclose(np.asarray(got[0], np.float32), want[0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.asarray(got[3], np.float32), want[1], atol=ATOL, rtol=0)


def test_predictor_is_pure(tiny_dir):
    predictor = ElmoPredictor(tiny_dir, id_column="id")
    batch = pa.table({"id": [7, 8, 9], "text": ["a b c", None, "d"]})
    first, second = predictor(batch), predictor(batch.to_batches()[0])
    assert first.equals(second) and first.column("id").to_pylist() == [7, 8, 9]
    assert first.column("elmo")[1].as_py() is None and len(first.column("elmo")[0].as_py()) == 3


def test_bad_inputs_are_named_and_write_nothing(tiny_dir, tmp_path):
    pq.write_table(pa.table({"body": ["a b"], "n": [1]}), tmp_path / "ok.parquet")
    with pytest.raises(InputError, match=r"\['text'\] not found; the columns are \['body', 'n'\]"):
        embed_parquet(tmp_path / "ok.parquet", tmp_path / "o1", tiny_dir, **FAST)
    assert not (tmp_path / "o1").exists()
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"text": ["a b"]}), bad / "a.parquet")
    (bad / "b.parquet").write_bytes(b"this is not parquet at all")
    with pytest.raises(InputError, match=r"b\.parquet: not a Parquet file or corrupt"):
        embed_parquet(bad, tmp_path / "o2", tiny_dir, **FAST)
    full = (bad / "a.parquet").read_bytes()
    (bad / "b.parquet").write_bytes(full[: len(full) // 2] + full[-100:])  # a broken Parquet file
    with pytest.raises(InputError, match=r"b\.parquet"):
        embed_parquet(bad, tmp_path / "o3", tiny_dir, **FAST)
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


def test_a_bf16_job_is_close_to_fp32_and_resumes_only_in_bf16(corpus, tiny_dir, tmp_path):
    fp32 = embed_parquet(corpus, tmp_path / "fp32", tiny_dir, id_column="id", **FAST)
    bf16 = embed_parquet(corpus, tmp_path / "bf16", tiny_dir, id_column="id", precision="bf16", **FAST)
    assert bf16["run"]["precision"] == "bf16" and bf16["rows"] == fp32["rows"]
    a, b = rows_of(tmp_path / "fp32"), rows_of(tmp_path / "bf16")
    assert a.column("id").equals(b.column("id"))
    x = np.concatenate([np.asarray(v, np.float64) for v in a.column("elmo").to_pylist() if v])  # (N, D)
    y = np.concatenate([np.asarray(v, np.float64) for v in b.column("elmo").to_pylist() if v])
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    assert cos.min() >= 0.999 and np.abs(x - y).max() > 1e-6, (cos.min(), np.abs(x - y).max())
    with pytest.raises(OutputDirError, match=r"different options: precision not given here, bf16 in _job.parquet\)"):
        embed_parquet(corpus, tmp_path / "bf16", tiny_dir, id_column="id", resume=True, **FAST)


def test_output_dir_of_another_job_is_refused(corpus, tiny_dir, tmp_path):
    out = tmp_path / "out"
    embed_parquet(corpus, out, tiny_dir, rows_per_shard=100, **FAST)
    with pytest.raises(OutputDirError, match="already holds this job's output; pass --resume"):
        embed_parquet(corpus, out, tiny_dir, rows_per_shard=100, **FAST)
    with pytest.raises(OutputDirError, match=r"another job's output \(different options: dtype float16 here, float32 in _job.parquet\)"):
        embed_parquet(corpus, out, tiny_dir, rows_per_shard=100, dtype="float16", resume=True, **FAST)
    m = embed_parquet(corpus, out, tiny_dir, rows_per_shard=100, resume=True, max_tokens_per_batch=999, quiet=True)
    assert m["this_run"]["shards"] == 0 and m["this_run"]["shards_kept"] == 2
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(OutputDirError, match="not empty"):
        embed_parquet(corpus, tmp_path / "other", tiny_dir, **FAST)


def test_cli_embed_and_errors(corpus, tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["embed", "--text", str(corpus), "--out", str(out), "--model", str(tiny_dir), "--id-column", "id",
                 "--dtype", "float16", "--quiet", "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest == read_record(out / "_manifest.parquet")
    assert manifest["options"]["dtype"] == "float16" and manifest["rows"] == 160
    assert manifest["model"]["sha256"] and manifest["this_run"]["tokens_per_second"] > 0
    assert main(["embed", "--text", str(corpus), "--out", str(tmp_path / "o2"), "--model", str(tiny_dir), "--text-column", "nope"]) == 2
    assert "['nope'] not found; the columns are ['id', 'speech', 'text']" in capsys.readouterr().err
    assert main(["embed", "--text", str(corpus), "--out", str(tmp_path / "o3"), "--model", str(tiny_dir), "--backend", "tensorrt"]) == 2
    assert "tensorrt" in capsys.readouterr().err


def test_onnx_backend_gives_the_torch_vectors(corpus, tiny_dir, tmp_path):
    """The same job through an ONNX export (ONNX Runtime) matches the torch backend's vectors."""
    from export.onnx_export import export_onnx

    export_onnx(tiny_dir, tmp_path / "onnx", shapes=((1, 1), (3, 8)), threads=1)
    embed_parquet(corpus, tmp_path / "out", model=tmp_path / "onnx", backend="onnx", **FAST)
    texts = ds.dataset(corpus, format="parquet").to_table(columns=["text"]).column("text").to_pylist()
    table = rows_of(tmp_path / "out")
    assert table.num_rows == len(texts)
    # the ONNX Runtime export vs the torch Embedder: ORT vs torch fp32 kernels, other sum orders
    check_against_embedder(table, texts, tiny_dir, atol=1e-4)
    manifest = read_record(tmp_path / "out" / "_manifest.parquet")
    assert manifest["run"]["backend"] == "onnx" and manifest["model"]["format"] == "onnx"
    assert manifest["model"]["sha256"] == file_sha256(tmp_path / "onnx" / "model.onnx")


def test_device_option_is_checked_and_reaches_the_backend(corpus, tiny_dir, tmp_path, capsys):
    import torch

    from inference.errors import BackendUnavailableError
    from inference.registry import onnx_providers, open_backend
    from inference.model_run import resolve_run
    from inference.run_settings import RunSettings
    from pipelines.options import EmbedOptions, output_options

    with pytest.raises(InputError, match="device must be cpu, cuda or cuda:N, got 'gpu'"):
        resolve_run(tiny_dir, device="gpu")  # the run's one check
    with pytest.raises(InputError, match="device must be cpu, cuda or cuda:N, got 'gpu'"):
        embed_parquet(corpus, tmp_path / "o0", tiny_dir, device="gpu", **FAST)
    with pytest.raises(InputError, match="needs --num-gpus-per-replica"):
        embed_parquet(corpus, tmp_path / "o0", tiny_dir, engine="ray", device="cuda", **FAST)
    assert "device" not in output_options({**EmbedOptions().to_dict(), "device": "cuda:1"})  # a resume may switch
    from pipelines.claim_first import RunMaker
    from pipelines.job import plan_job  # a Ray job's GPUs are its workers': a driver without one plans it

    maker = RunMaker.of(tiny_dir, RunSettings(device="cuda"), remote=True)
    job = plan_job(corpus, tmp_path / "o1", maker, EmbedOptions(engine="ray", num_gpus_per_worker=1, quiet=True))
    assert (job.run.device, job.predictor, job.run.threads.count) == ("cuda", None, 1)
    import ray

    ray.shutdown()  # planning reached a local Ray cluster (the engine starts before OUTPUT_DIR is claimed)
    assert onnx_providers("cpu") == ["CPUExecutionProvider"]
    assert onnx_providers("cuda:1") == [("CUDAExecutionProvider", {"device_id": 1})]
    m = embed_parquet(corpus, tmp_path / "out", tiny_dir, device="cpu", **FAST)
    assert m["engine"] == {"name": "local"}  # OMP_NUM_THREADS=1 (tests/conftest.py)
    assert (m["run"]["threads"], m["run"]["device"]) == (1, "cpu")
    if torch.cuda.is_available():
        return  # tests/gpu/test_gpu.py runs it on the GPU
    with pytest.raises(BackendUnavailableError, match="torch sees no CUDA GPU here"):
        open_backend(tiny_dir, "torch", device="cuda")
    assert main(["embed", "--text", str(corpus), "--out", str(tmp_path / "o2"), "--model", str(tiny_dir), "--device", "cuda"]) == 2
    assert "--device cuda: torch sees no CUDA GPU here" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()  # refused before the job claimed its output directory
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(BackendUnavailableError, match="has no CUDAExecutionProvider; install the `gpu` extra"):
            embed_parquet(corpus, tmp_path / "o3", tiny_dir, backend="onnx", device="cuda", **FAST)
        assert not (tmp_path / "o3").exists()


def test_default_threads_leave_a_core_to_the_job_when_the_model_is_cheap(tiny_dir, monkeypatch):
    import inference.model_run
    from elmo_core import ElmoConfig
    from inference.model_run import default_threads
    from runtime import CpuBudget

    budget = CpuBudget(8, "cgroup quota 8.0 CPUs of 64")  # what runtime.cpus gave (tests/runtime/test_cpus.py)
    monkeypatch.setattr(inference.model_run, "process_cpu_budget", lambda: budget)
    assert ElmoConfig().flops_per_token == pytest.approx(204.26e6, rel=1e-3)  # the published full size
    assert default_threads(ElmoConfig(), "cpu") == budget  # compute-bound: every CPU given
    tiny = ElmoConfig.from_json(tiny_dir / "options.json")
    assert default_threads(tiny, "cpu") == CpuBudget(7, "cgroup quota 8.0 CPUs of 64, one left to the job's "
                                                        "readers and writers (a small model)")
    assert default_threads(ElmoConfig(), "cuda").count == 7
    monkeypatch.setattr(inference.model_run, "process_cpu_budget", lambda: CpuBudget(1, "CPU affinity 1 of 64 CPUs"))
    assert default_threads(tiny, "cpu") == CpuBudget(1, "CPU affinity 1 of 64 CPUs")


def test_several_writer_threads_write_the_same_shards(corpus, tiny_dir, tmp_path):
    one = embed_parquet(corpus, tmp_path / "one", tiny_dir, id_column="id", rows_per_shard=40, **FAST)
    three = embed_parquet(corpus, tmp_path / "three", tiny_dir, id_column="id", rows_per_shard=40, writer_threads=3,
                          **FAST)
    assert len(one["shards"]) >= 4 and [(s["file"], s["sha256"]) for s in three["shards"]] == \
        [(s["file"], s["sha256"]) for s in one["shards"]]  # the same bytes, listed in input order
    with pytest.raises(InputError, match="writer_threads must be a positive integer"):
        embed_parquet(corpus, tmp_path / "bad", tiny_dir, writer_threads=0, **FAST)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_each_shard_is_hashed_as_written_never_read_back(corpus, tiny_dir, tmp_path, monkeypatch, fmt):
    """A shard's sha256 is computed while its windows are written (``GrowingFileDigest``), not by a
    second pass over the file at its commit: reading a shard back during the job fails it here, and
    the recorded sha256 and size are those of the bytes on disk."""
    import pipelines.output_dir as output_dir

    def read_back(path):
        raise AssertionError(f"{path} read back to hash it")
    monkeypatch.setattr(output_dir, "file_sha256", read_back)
    m = embed_parquet(corpus, tmp_path / "out", tiny_dir, format=fmt, rows_per_shard=40, **FAST)  # 64-row windows: several a shard
    assert len(m["shards"]) == 4
    for shard in m["shards"]:
        data = (tmp_path / "out" / shard["file"]).read_bytes()
        assert (shard["sha256"], shard["bytes"]) == (hashlib.sha256(data).hexdigest(), len(data))
    monkeypatch.undo()
    assert verify_output(tmp_path / "out")["shards"] == 4


@pytest.mark.parametrize("maps", ["whole", "in slices", "refused"])
def test_a_growing_files_digest_is_its_whole_files(tmp_path, monkeypatch, maps):
    import mmap

    import storage.locations as locations

    if maps == "in slices":  # at most two pages' granules mapped at once: slices that start inside a granule
        monkeypatch.setattr(locations, "_MAP_BYTES", 2 * mmap.ALLOCATIONGRANULARITY)
    if maps == "refused":  # a file system that cannot map files: the bytes are read instead
        def refused(*args, **kwargs):
            raise OSError("mmap: operation not supported")
        monkeypatch.setattr(locations.mmap, "mmap", refused)
    path = tmp_path / "f"
    path.write_bytes(b"")
    digest = GrowingFileDigest(path)
    digest.advance()  # an empty file: nothing to map
    written = b""
    for piece in (b"x" * 5, b"", bytes(range(256)) * 4099, b"tail"):  # across pages, one empty append
        with open(path, "ab") as f:
            f.write(piece)
        written += piece
        digest.advance()
    assert (digest.hexdigest(), digest.hashed) == (hashlib.sha256(written).hexdigest(), len(written))


def test_a_files_sha256_reads_it_never_maps_it(tmp_path, monkeypatch):
    """A model's weights or an input another process may truncate while it is hashed: a mapped page
    past the new end would kill the process (SIGBUS), and a mapping counts the whole file as resident."""
    import storage.locations as locations

    def mapped(*args, **kwargs):
        raise AssertionError("file_sha256 mapped the file")
    monkeypatch.setattr(locations.mmap, "mmap", mapped)
    data = bytes(range(256)) * 9000  # several reads of a MiB
    (tmp_path / "f").write_bytes(data)
    assert file_sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest() == file_sha256(str(tmp_path / "f"))


def test_a_full_disk_while_a_shard_is_written_names_the_shard(corpus, tiny_dir, tmp_path, monkeypatch):
    """pyarrow's write error names no file: the job's error names the shard it was writing."""
    from pipelines import shard_files

    def full(self, table):
        raise OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")
    monkeypatch.setattr(shard_files._ParquetWriter, "write", full)
    with pytest.raises(OutputDirError) as e:
        embed_parquet(corpus, tmp_path / "out", tiny_dir, rows_per_shard=40, **FAST)
    assert str(e.value).startswith(f"{tmp_path / 'out' / 'part-00000-00000.parquet'}: Error writing bytes"), e.value
    assert "the disk is full: free space, then rerun with --resume" in str(e.value)


def test_compression_of_the_vector_column(corpus, tiny_dir, tmp_path):
    base = embed_parquet(corpus, tmp_path / "snappy", tiny_dir, **FAST)
    m = embed_parquet(corpus, tmp_path / "zstd", tiny_dir, compression="zstd", **FAST)
    assert m["options"]["compression"] == "zstd" and base["options"]["compression"] == "snappy"
    shard = sorted((tmp_path / "zstd").glob("part-*.parquet"))[0]
    meta = pq.ParquetFile(shard).metadata.row_group(0)
    assert {meta.column(i).compression for i in range(meta.num_columns)} == {"ZSTD"}
    stats = {meta.column(i).path_in_schema: meta.column(i).is_stats_set for i in range(meta.num_columns)}
    assert stats == {"elmo.list.element.list.element": False}  # no min/max of the vectors' components
    with_id = embed_parquet(corpus, tmp_path / "id", tiny_dir, id_column="id", **FAST)["shards"][0]["file"]
    meta = pq.ParquetFile(tmp_path / "id" / with_id).metadata.row_group(0)
    assert {meta.column(i).path_in_schema: meta.column(i).is_stats_set for i in range(meta.num_columns)} == \
        {"id": True, "elmo.list.element.list.element": False}
    a = ds.dataset(tmp_path / "snappy", format="parquet").to_table()
    b = ds.dataset(tmp_path / "zstd", format="parquet").to_table()
    assert a.equals(b)
    with pytest.raises(InputError, match="compression must be one of"):
        embed_parquet(corpus, tmp_path / "bad", tiny_dir, compression="gzip", **FAST)


@pytest.mark.parametrize("output, pool", [("mixed", "mean"), ("all", "max")])
def test_pooled_rows_pool_each_rows_token_vectors(tiny_dir, tmp_path, output, pool):
    """One vector per row, pooled over all of its tokens (a long row over all of its windows), null
    for null or empty text; against the reference ``pool_tokens`` over the same job's per-token output."""
    import torch

    from elmo_core import pool_tokens

    texts = ["The cat sat on the mat .", None, "", "   ", " ".join(["word"] * 40) + " end", "Hi"]
    corpus = tmp_path / "in" / "a.parquet"
    corpus.parent.mkdir()
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": pa.array(texts, pa.string())}), corpus)
    opts = dict(id_column="id", output=output, max_sentence_length=16, window_context=2, quiet=True)
    m = embed_parquet(corpus, tmp_path / "pooled", tiny_dir, pool=pool, **opts)
    embed_parquet(corpus, tmp_path / "tokens", tiny_dir, **opts)
    assert m["null_rows"] == 1 and m["empty_rows"] == 2 and m["windowed_rows"] == 1
    pooled = ds.dataset(tmp_path / "pooled", format="parquet").to_table()
    assert pa.types.is_fixed_size_list(pooled.schema.field("elmo").type)
    tokens = ds.dataset(tmp_path / "tokens", format="parquet").to_table().column("elmo").to_pylist()
    for i, (got, tok) in enumerate(zip(pooled.column("elmo").to_pylist(), tokens)):
        if not tok:  # null or no token
            assert got is None, i
            continue
        tok = torch.from_numpy(np.asarray(tok, np.float32))[None]  # (1, T, [L+1,] D)
        want = pool_tokens(tok, torch.ones(tok.shape[:2], dtype=torch.bool), pool)[0].numpy()  # the reference
        # pooled by reduceat vs torch over the same fp32 tokens: ~log2(T) ulp
        np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=1e-5, rtol=1e-5, err_msg=str(i))
    assert verify_output(tmp_path / "pooled")["rows"] == len(texts)


def test_several_writers_each_take_shards_of_every_window_and_the_vectors_are_one_writers(tiny_dir, tmp_path):
    """W writer threads on the local runner: two shards a writer for a corpus this small, windows
    that go on past a shard's end, so the batches are those of one big shard: the same vectors,
    bit for bit, and every writer writes."""
    corpus = tmp_path / "corpus"
    write_sample_corpus(corpus, rows=4000, files=1, row_group_rows=700)
    opts = dict(max_tokens_per_batch=4096, sort_window_rows=1200, sort_window_tokens=10**6, quiet=True)
    one = embed_parquet(corpus, tmp_path / "one", tiny_dir, rows_per_shard=10**6, **opts)
    two = embed_parquet(corpus, tmp_path / "two", tiny_dir, writer_threads=2, **opts)
    assert two["options"]["rows_per_shard"] == 1000 and "2 writer threads: 2 shards a slot" in \
        two["options"]["rows_per_shard_reason"]
    assert [s["rows"] for s in two["shards"]] == [1000] * 4 and len(one["shards"]) == 1
    assert sorted(two["stages"]["writers"]) == ["elmo-writer-0", "elmo-writer-1"]
    assert min(two["stages"]["writers"].values()) > 0
    for job in (one, two):  # each stage's CPU on its own thread: some, and within the process's and its wall
        st = job["stages"]
        assert all(st["cpu_seconds"][k] > 0 for k in ("read", "prepare", "model", "write")), st
        assert sum(st["cpu_seconds"].values()) <= st["process_cpu_seconds"] + 0.05, st
        assert all(st["cpu_seconds"][k] <= st["seconds"][k] + 0.05 for k in st["seconds"]), st
    a, b = rows_of(tmp_path / "one"), rows_of(tmp_path / "two")
    assert a.column("elmo").equals(b.column("elmo"))


def test_a_local_job_cuts_its_shards_for_its_writer_threads(tmp_path):
    """One writer: the default size; W writers on a large corpus: 1/W of a sort window's rows, at
    least 10,000; a small corpus: two shards a writer, at least 500; Spark and Ray as before."""
    from types import SimpleNamespace

    from pipelines.options import EmbedOptions
    from pipelines.shard_size import settle_rows_per_shard

    big, small = [SimpleNamespace(rows=10**7)], [SimpleNamespace(rows=3000)]

    def size(files, **options):  # type: ignore[no-untyped-def]
        return settle_rows_per_shard(EmbedOptions.coerce(quiet=True, **options), files, None)

    assert size(big, writer_threads=1, sort_window_rows=1024) == (100_000, "the local runner writes one shard at a "
                                                                  "time: the default")
    rows, why = size(big, writer_threads=8, sort_window_rows=131_072)
    assert rows == 16_384 and why == "8 writer threads: 1/8 of a sort window's 131,072 rows each, at least 10,000"
    assert size(big, writer_threads=8, sort_window_rows=65_536)[0] == 10_000
    assert size(big, writer_threads=2, sort_window_rows=1024)[0] == 10_000  # a CPU's window: not 512-row files
    assert size(small, writer_threads=8, sort_window_rows=65_536)[0] == 500
    assert size(small, writer_threads=2, sort_window_rows=65_536)[0] == 750
    assert size(big, engine="ray", workers=4, writer_threads=8, sort_window_rows=1024)[0] == 100_000


def test_the_run_line_and_manifest_report_the_batch_budget_asked_not_the_devices(corpus, tiny_dir, tmp_path, capsys):
    """--max-batch-tokens and the sort windows asked replace the device's in the run record the job
    reports (its line, the manifest's ``run.batch``), with the device's kept in the reason; the
    library's predictor reports the same; asking the device's own changes nothing."""
    own = 16_384  # the tiny model's batches on a CPU (inference.batching.cpu_batch_budget), in windows of 65,536 tokens
    assert main(["embed", "--text", str(corpus), "--out", str(tmp_path / "out"), "--model", str(tiny_dir),
                 "--max-batch-tokens", "300", "--sort-window-rows", "40"]) == 0
    line = capsys.readouterr().err
    assert "batches of 300 tokens: asked: 300 tokens a batch, 40 rows a sort window (the run's own: batches of " \
           f"{own:,} tokens: " in line
    batch = read_record(tmp_path / "out" / "_manifest.parquet")["run"]["batch"]
    assert (batch["tokens"], batch["window_tokens"], batch["window_rows"]) == (300, 65536, 40)
    predictor = ElmoPredictor(tiny_dir, {"max_tokens_per_batch": own})
    assert predictor.run.batch.tokens == own and "asked" not in predictor.run.batch.reason
    assert ElmoPredictor(tiny_dir, {"max_tokens_per_batch": 512}).run.batch.tokens == 512


def test_a_gpu_jobs_writer_threads_follow_its_cpus():
    """Enough writers on a GPU box for the model's rate (float32 lists: ~34k tokens/s a thread
    against ~313k of an H200's model), the model's, reader's and planner's threads left over;
    one on a CPU, whose cores run the model."""
    from pipelines.options import default_writers

    assert [default_writers("cuda", n) for n in (1, 2, 4, 8, 10, 16, 32, 128)] == [1, 1, 2, 6, 8, 12, 16, 16]
    assert default_writers("cuda:1", 16) == 12 and default_writers("cpu", 64) == 1


def test_a_jobs_windows_reuse_the_buffers_of_windows_written_before(corpus, tiny_dir, tmp_path, monkeypatch):
    """Each window's vectors go to memory an earlier window held once it is written: a new buffer
    only where the windows held at once (the writer's room, 3, and the one being computed) hold
    every one that fits, or every free one is under its size or over twice it (here 11 of 59 windows; 59
    without the pool); the vectors are those of a job with one window."""
    import time
    import pipelines.shard_loop as shard_loop
    from pipelines.sink import ShardWriter
    from runtime.buffers import BufferPool
    pools: list[BufferPool] = []

    class Counted(BufferPool):
        def __init__(self) -> None:
            super().__init__()
            self.asked = 0
            pools.append(self)

        def _take(self, nbytes: int):
            self.asked += 1
            return super()._take(nbytes)

    monkeypatch.setattr(shard_loop, "BufferPool", Counted)
    write = ShardWriter.write
    monkeypatch.setattr(ShardWriter, "write", lambda *a: time.sleep(0.01) or write(*a))  # windows wait in the room
    many, one = tmp_path / "many", tmp_path / "one"
    embed_parquet(corpus, many, tiny_dir, id_column="id", sort_window_tokens=50, **FAST)
    (pool,) = pools
    assert pool.asked >= 40 and 1 <= pool.made <= pool.asked // 3
    embed_parquet(corpus, one, tiny_dir, id_column="id", sort_window_tokens=100_000, **FAST)
    a, b = rows_of(many), rows_of(one)
    assert a.column("id").equals(b.column("id"))
    for i, (x, y) in enumerate(zip(a.column("elmo").to_pylist(), b.column("elmo").to_pylist())):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=ATOL, rtol=0, err_msg=f"row {i}")
