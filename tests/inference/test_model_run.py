"""The one resolved model run (``inference.model_run``): what it settles and why, that it is what
every door opens, and that nothing else in the library opens a backend."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from elmo_core.errors import InputError
from export.cache import cached_onnx_export
from inference import Embedder
from inference.model_run import ModelRun, default_threads, resolve_run
from runtime import process_cpu_budget

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("elmo_core", "runtime", "corpora", "formats", "inference", "export", "training", "pipelines", "serving",
           "elmo_cli")


def test_a_model_directory_resolves_to_torch_fp32_on_this_process_cpus(tiny_dir):
    run = resolve_run(tiny_dir)
    assert (run.model, run.backend, run.device, run.precision) == (str(tiny_dir.resolve()), "torch", "cpu", "fp32")
    assert run.precision_reason == "the default" and run.threads == process_cpu_budget() and run.source is None
    assert run.describe() == (f"{tiny_dir.resolve()} (torch on cpu, fp32: the default; {process_cpu_budget()}; "
                              f"packed layout: small matrices: eager steps (nothing to measure); {run.batch})")
    record = json.loads(json.dumps(run.to_dict()))  # what --json and the manifest record
    assert record["threads"] == run.threads.count and record["threads_reason"] == run.threads.reason
    assert record["batch"] == {"tokens": 16384, "window_tokens": 65536, "window_rows": 4096,  # narrow: the most
                               "reason": run.batch.reason, "rows": None} and str(run.batch).startswith("batches of 16,384 tokens: ")
    assert "config" not in record and record["warning"] is None
    assert resolve_run(tiny_dir, precision="fp32").precision_reason == "asked for"
    assert resolve_run(tiny_dir, threads=3).threads.count == 3


def test_a_cpus_batches_and_sort_windows_follow_the_models_widths():
    """A CPU's batches: the most tokens (a power of two from 4,096 to 16,384) whose activations fit
    512 MiB, at least 4 to a window; its sort windows: the most (16,384 to 65,536) whose vectors, every
    layer in float32, fit 256 MiB, rows a sixteenth. Full size, the medium published size and a narrow
    model of full-width output (the host benchmark's) keep 4,096-token batches;
    the shipped model's widths take 16,384 in windows of 65,536 (its job 1.29x faster than at 4,096
    and 16,384: docs/performance.md)."""
    from inference.batching import cpu_batch_budget

    got = {(C, P): (b.tokens, b.window_tokens, b.window_rows)
           for C, P in [(4096, 512), (2048, 256), (1024, 128), (512, 128), (8, 512)] for b in [cpu_batch_budget(C, P, 2)]}
    assert got == {(4096, 512): (4096, 16384, 1024), (2048, 256): (4096, 32768, 2048),
                   (1024, 128): (8192, 65536, 4096), (512, 128): (16384, 65536, 4096), (8, 512): (4096, 16384, 1024)}
    shipped = resolve_run(ROOT / "models" / "default").batch
    assert (shipped.tokens, shipped.window_tokens, shipped.window_rows) == (16384, 65536, 4096)
    assert str(shipped).startswith("batches of 16,384 tokens: ") and "sort windows of 65,536 tokens / 4,096 rows" in str(shipped)
    least = cpu_batch_budget()
    assert (least.tokens, least.window_tokens, least.window_rows) == (4096, 16384, 1024)


def test_a_gpu_runs_batches_sized_to_its_memory():
    """131,072 tokens on an 80 GB card for the full-size model (a quarter of its memory for the
    activations); within the bounds whatever the card; sort windows of 8 batches."""
    from inference.batching import gpu_budget

    full = {"lstm_dim": 4096, "projection_dim": 512, "n_layers": 2}
    sizes = {gb: gpu_budget(gb << 30, **full, name="a card").tokens for gb in (8, 24, 40, 80, 141, 1024)}
    assert sizes == {8: 8192, 24: 32768, 40: 65536, 80: 131072, 141: 131072, 1024: 262144}
    h100 = gpu_budget(80 << 30, **full, name="NVIDIA H100")
    assert (h100.window_tokens, h100.window_rows) == (8 * 131072, 65536) and "NVIDIA H100's 80 GiB" in h100.reason
    assert gpu_budget(1 << 20, **full, name="a tiny card").tokens == 4096  # the floor


def test_a_job_leaves_its_readers_a_cpu_and_replicas_take_one_each(tiny_dir):
    from inference.batching import gpu_budget

    assert resolve_run(tiny_dir, job=True).threads == default_threads(resolve_run(tiny_dir).config, "cpu")
    remote = resolve_run(tiny_dir, remote=True, device="cuda")  # a replica's GPU is checked where it runs
    assert remote.threads.count == 1 and "one per replica" in remote.threads.reason and remote.device == "cuda"
    assert remote.precision == "bf16" and remote.precision_reason.startswith("the default on CUDA, ")
    ls = remote.config.lstm
    assert remote.batch.tokens == gpu_budget(40 << 30, ls.dim, ls.projection_dim, ls.n_layers, "").tokens
    assert "a replica's GPU, not visible here" in remote.batch.reason
    assert remote.batch.rows == 1024 and "planned for up to 1,024 static rows" in str(remote.batch)  # rows layout
    share = remote.on_replica(4, "its share")
    assert share.threads.count == 4 and share.model == remote.model and remote.threads.count == 1


def test_an_export_runs_its_own_precision_and_the_backend_is_read_from_it(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path / "cache"))
    export, _ = cached_onnx_export(tiny_dir, "fp32")
    run = resolve_run(export)
    assert (run.backend, run.precision, run.precision_reason) == ("onnx", "fp32", "the export's precision")
    assert run.config.output_dim == resolve_run(tiny_dir).config.output_dim
    with pytest.raises(InputError, match="is an fp32 ONNX export; for --precision int8"):
        resolve_run(export, precision="int8")
    with pytest.raises(InputError, match="--weights names a published-format weights file"):
        resolve_run(export, weights=tiny_dir / "weights.hdf5")
    with pytest.raises(InputError, match="token embeddings are used by the torch backend only"):
        resolve_run(export, token_embeddings=tmp_path / "t.hdf5")


def test_an_exporter_is_asked_for_a_model_directory_on_the_onnx_backend(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path / "cache"))
    export, _ = cached_onnx_export(tiny_dir, "fp32")
    asked = []

    def exporter(model: str, weights: str | None, precision: str, threads: int) -> tuple[str, str, str]:
        asked.append((model, weights, precision, threads))
        return str(export), "fp32", "measured here"
    run = resolve_run(tiny_dir, backend="onnx", precision="auto", threads=2, exporter=exporter)
    assert asked == [(str(tiny_dir.resolve()), None, "auto", 2)]
    assert (run.model, run.source, run.precision, run.precision_reason) == (
        str(export), str(tiny_dir.resolve()), "fp32", "measured here")
    assert f"exported from {tiny_dir.resolve()}" in run.describe()


def test_open_is_the_backend_every_door_gets(tiny_dir, monkeypatch):
    run = resolve_run(tiny_dir, threads=1)
    sentences = [["The", "cat", "sat", "."], ["A", "longer", "sentence", "than", "that", "one"]]
    with Embedder(run.open()) as opened, Embedder.open(tiny_dir, threads=1) as door:
        for a, b in zip(opened.embed_sentences(sentences), door.embed_sentences(sentences)):
            np.testing.assert_array_equal(a, b)  # the same backend, the same numbers
    opened_runs: list[ModelRun] = []
    original = ModelRun.open

    def spy(self: ModelRun, **options: object):  # type: ignore[no-untyped-def]
        opened_runs.append(self)
        return original(self, **options)
    monkeypatch.setattr(ModelRun, "open", spy)
    Embedder.open(tiny_dir, threads=1).close()
    assert [r.threads.count for r in opened_runs] == [1]


def test_no_library_module_opens_a_backend_but_the_run():
    """``registry.load_backend`` is called by ``ModelRun.open`` only (and by ``registry.open_backend``,
    the checked loader for callers outside the library: benchmarks): every door opens through the run
    (the exporter builds the backends its parity checks compare itself: export/onnx_export.py, export/build.py)."""
    callers = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                name = getattr(node.func, "id", getattr(node.func, "attr", None)) if isinstance(node, ast.Call) else None
                where = path.relative_to(ROOT).as_posix()
                if name in ("open_backend", "load_backend") and where not in ("inference/model_run.py",
                                                                              "inference/registry.py"):
                    callers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert callers == [], callers


def test_a_jobs_replicas_each_weigh_the_warm_up_against_their_share(tiny_dir):
    """``ModelRun.shared``: Ray's actors and Spark's Python workers each pay their own warm-up over
    their share of the pending rows' expected tokens."""
    run = resolve_run(tiny_dir, remote=True, expected_tokens=800_000)
    share = run.shared(rows=600, total_rows=1_000, replicas=4)
    assert share.expected_tokens == 120_000 and share.layout == run.layout and share.pin == run.pin
    assert run.shared(rows=0, total_rows=1_000, replicas=1).expected_tokens == 0  # resumed: nothing left
    assert resolve_run(tiny_dir, remote=True).shared(600, 1_000, 4).expected_tokens is None  # no end in sight
