"""How the recurrence runs (``inference.layout``): asked for, CUDA's, and on a CPU measured once per
CPU, precision, shape and threads, cached, and chosen only by a margin; the run records it."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from elmo_core import ElmoConfig
from elmo_core.errors import InputError, SettingError
from inference.backends import TorchBackend
from inference.embedder import Embedder
from inference.layout import (CPU_ROW_COUNTS, FUSED_MARGIN, LAYOUTS_CODE, ONEDNN, Layout, candidates, choose,
                              resolve_layout)
from inference.model_run import resolve_run
from inference.packed_gemm import packed_gemm_available


def _config(dim: int, projection: int) -> ElmoConfig:
    from tests.conftest import TINY_OPTIONS

    options = json.loads(json.dumps(TINY_OPTIONS))
    options["lstm"].update(dim=dim, projection_dim=projection)
    return ElmoConfig.from_dict(options)


def test_asked_for_cuda_and_small_models_are_not_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path))
    never = lambda *a: pytest.fail("measured")  # noqa: E731
    big, small = _config(4096, 512), _config(16, 8)
    assert resolve_layout("fused", "cpu", "fp32", big, 1, never).reason == "asked for"
    assert resolve_layout(None, "cuda", "bf16", big, 1, never).name == "rows"
    assert resolve_layout("auto", "cpu", "bf16", small, 1, never).name == "packed"
    assert resolve_layout("rows", "cpu", "fp32", big, 1, never) == Layout("rows", "asked for")
    with pytest.raises(InputError, match="--layout must be one of"):
        resolve_layout("fast", "cpu", "fp32", big, 1, never)
    assert not (tmp_path / "layouts.json").exists()


def test_the_backend_refuses_auto_which_the_run_settles(tiny_dir, tmp_path, monkeypatch):
    """``auto`` given to the backend itself ran the compiled fused layout, measured by nothing: refused,
    naming what settles it; the run settles it (the tiny model: packed, unmeasured)."""
    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path))
    with pytest.raises(SettingError) as e:
        TorchBackend.from_files(tiny_dir, layout="auto")
    assert e.value.text == ("`layout` auto is settled by the run (measured once per CPU, rows on CUDA): open the "
                            "model with Embedder.open(model, layout=\"auto\") or resolve_run(model, "
                            "layout=\"auto\").open(), or pass one of ('packed', 'fused', 'rows') (None: the "
                            "device's default)")
    with Embedder.open(tiny_dir, layout="auto") as emb:
        assert emb.backend.fast.layout == "packed"


def test_the_shipped_models_size_is_measured(tmp_path, monkeypatch):
    """128 x 2,048 recurrent weights (models/default): its steps run fused 1.67x packed on a Zen 5,
    0.67x on an AMX Xeon, so the layout is measured; below MEASURED_MIN_WEIGHTS it is not."""
    from inference.layout import MEASURED_MIN_WEIGHTS

    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path))
    calls = []
    measure = lambda config, precision, threads: calls.append(precision) or ({  # noqa: E731
        name: (3.0 if name == "fused" else 1.0) for name in candidates(config)}, 0.0)
    assert 128 * 4 * 512 == MEASURED_MIN_WEIGHTS > 64 * 4 * 256
    assert resolve_layout(None, "cpu", "fp32", _config(512, 128), 2, measure).name == "fused" and calls == ["fp32"]
    assert resolve_layout(None, "cpu", "fp32", _config(256, 64), 2, measure).name == "packed" and calls == ["fp32"]


def test_a_cpu_measures_once_per_precision_and_threads_and_keeps_the_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path))
    big, calls = _config(4096, 512), []

    def measure(config, precision, threads):
        calls.append((precision, threads))
        return {"packed": 100.0, "fused": 200.0 if precision == "bf16" else 101.0, "rows 64": 99.0, "rows 1024": 50.0}, 1.0
    assert resolve_layout(None, "cpu", "bf16", big, 2, measure).name == "fused"
    assert resolve_layout(None, "cpu", "bf16", big, 2, measure).name == "fused"  # from the cache
    assert resolve_layout(None, "cpu", "fp32", big, 2, measure).name == "packed"  # within the margin
    assert resolve_layout(None, "cpu", "fp32", big, 1, measure).name == "packed"
    assert calls == [("bf16", 2), ("fp32", 2), ("fp32", 1)]
    kept = json.loads((tmp_path / "layouts.json").read_text())
    assert len(kept) == 3 and any("bf16" in key and "2 threads" in key for key in kept)
    (tmp_path / "layouts.json").write_text(json.dumps({key: [1, 2] for key in kept}))  # damaged entries
    assert resolve_layout(None, "cpu", "bf16", big, 2, measure).name == "fused" and len(calls) == 4  # measured again
    key = next(key for key in kept if "bf16" in key and "2 threads" in key)
    partial = {"tokens_per_s": {"packed": 1.0, "fused": 2.0}, "warmup_s": 1.0}
    (tmp_path / "layouts.json").write_text(json.dumps({key: partial}))  # without the rows
    assert resolve_layout(None, "cpu", "bf16", big, 2, measure).name == "fused" and len(calls) == 5  # measured again
    figures = {"tokens_per_s": {"packed": 300.0, "fused": 1.0, "rows 64": 1.0, "rows 1024": 1.0},  # the big model's
               "warmup_s": 1.0}
    older = key.replace(f"layouts v{LAYOUTS_CODE}", f"layouts v{LAYOUTS_CODE - 1}")
    assert older != key
    (tmp_path / "layouts.json").write_text(json.dumps({older: figures}))  # another version of the layouts' code
    assert resolve_layout(None, "cpu", "bf16", big, 2, measure).name == "fused" and len(calls) == 6  # measured again
    (tmp_path / "layouts.json").write_text(json.dumps({key: figures}))
    assert resolve_layout(None, "cpu", "bf16", big, 2, measure).name == "packed" and len(calls) == 6  # this version's


def test_the_measured_rows_and_their_count_are_kept_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path))
    big, calls = _config(4096, 512), []

    def measure(config, precision, threads):
        calls.append(precision)
        return {"packed": 100.0, "fused": 120.0, "rows 64": 180.0, "rows 1024": 170.0}, 2.0
    for _ in range(3):
        chosen = resolve_layout("auto", "cpu", "bf16", big, 2, measure)
        assert (chosen.name, chosen.rows) == ("rows", 64) and "rows 64 180" in chosen.reason
    assert calls == ["bf16"]  # measured once, then read from layouts.json
    assert set(candidates(big)) == {"packed", "fused", *(f"rows {r}" for r in CPU_ROW_COUNTS)}
    # below fast_lstm.PACKED_MIN_WEIGHTS packed's products are plain: packed on oneDNN weights is measured too
    assert set(candidates(_config(512, 128))) == set(candidates(big)) | {ONEDNN}


def test_fused_is_chosen_only_by_the_margin():
    assert choose({"packed": 100.0, "fused": 100.0 * FUSED_MARGIN}).name == "fused"
    assert choose({"packed": 100.0, "fused": 100.0 * FUSED_MARGIN - 1}).name == "packed"
    assert choose({"packed": 100.0, "fused": 0.0}).name == "packed"  # fused could not run here
    assert choose({"packed": 0.0, "fused": 0.0}).name == "packed"
    assert "packed 100, fused 0 tokens/s" in choose({"packed": 100.0, "fused": 0.0}).reason
    assert choose({"packed": 100.0, "fused": 104.0, "rows 64": 100.0 * FUSED_MARGIN}) == \
        Layout("rows", choose({"packed": 100.0, "fused": 104.0, "rows 64": 100.0 * FUSED_MARGIN}).reason, 64)
    assert choose({"packed": 100.0, "fused": 104.0, "rows 64": 104.9}).name == "packed"  # within noise of packed
    # fp32 on an AMX Xeon, measured under load: a tie (0.96x-1.01x quiet) that ran 0.85x packed end to end
    assert choose({"packed": 1131.0, "fused": 1220.0, "rows 1024": 974.0, "rows 64": 934.0}).name == "packed"
    # bf16 on the same CPU: rows' full AMX tiles win beyond any noise
    assert choose({"packed": 1765.0, "fused": 2008.0, "rows 1024": 2207.0, "rows 64": 2133.0}).rows == 1024


def test_packed_on_onednn_is_the_base_a_compiled_layout_must_beat():
    """Both eager layouts pay no warm-up: the faster is taken; a compiled one (fused, rows) must beat
    it by the margin, not plain packed."""
    onednn = choose({"packed": 100.0, ONEDNN: 131.0, "fused": 130.0, "rows 64": 120.0})
    assert (onednn.name, onednn.onednn, onednn.rows) == ("packed", True, None)
    assert choose({"packed": 100.0, ONEDNN: 131.0, "fused": 131.0 * FUSED_MARGIN}).name == "fused"
    assert choose({"packed": 100.0, ONEDNN: 131.0, "fused": 131.0 * FUSED_MARGIN - 1}).onednn
    assert not choose({"packed": 100.0, ONEDNN: 99.0, "fused": 104.0}).onednn  # plain products measured faster
    assert not choose({"packed": 100.0, ONEDNN: 100.0}).onednn  # a tie keeps the fixed default
    # the shipped model on a Zen 5 (recurrence alone): MKL's AVX2 products against oneDNN's AVX-512
    assert choose({"packed": 28805.0, ONEDNN: 37603.0, "fused": 37220.0, "rows 64": 25261.0}).onednn


def test_a_measured_onednn_pick_is_recorded_and_runs_every_product_on_packed_weights(tiny_dir, tmp_path, monkeypatch):
    from inference import layout

    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(layout, "MEASURED_MIN_WEIGHTS", 1)  # the tiny model measured (its figures given here)
    monkeypatch.setattr(layout, "measure_layouts", lambda config, precision, threads: ({
        name: (2.0 if name == ONEDNN else 1.0) for name in candidates(config)}, 0.0))
    run = resolve_run(tiny_dir, threads=2)
    assert (run.layout.name, run.layout.onednn) == ("packed", True) and run.to_dict()["layout_onednn"] is True
    assert "packed layout (every product on packed oneDNN weights)" in run.describe()
    with run.open() as backend:
        lstm = backend.fast.lstm
        assert backend.fast.layout == "packed" and lstm.packed_min_weights == 0
        assert lstm.per_direction_products() == packed_gemm_available(torch.device("cpu"))
    assert run.on_cpu().layout.onednn is False  # the driver's check runs the unmeasured default
    plain = resolve_run(tiny_dir, threads=2, layout="packed")
    assert plain.layout.onednn is False and "oneDNN" not in plain.describe()


def test_the_run_records_its_layout_and_opens_the_backend_with_it(tiny_dir):
    run = resolve_run(tiny_dir, layout="fused")
    assert (run.layout.name, run.layout.reason) == ("fused", "asked for") and run.to_dict()["layout"] == "fused"
    assert "fused layout: asked for" in run.describe()
    with run.open() as backend:
        assert backend.fast.layout == "fused"
    assert resolve_run(tiny_dir, remote=True).layout.name == "auto"  # measured where each replica runs
    assert resolve_run(tiny_dir, remote=True).on_cpu().layout.name == "packed"  # the driver's check measures nothing
    cuda = resolve_run(tiny_dir, remote=True, device="cuda")
    assert cuda.layout.name == "rows" and cuda.on_cpu().layout.name == "packed"  # a driver checks a CUDA job's model on its CPU
    with cuda.on_cpu().open() as backend:
        assert backend.fast.layout == "packed" and backend.fast.graphs is None



def test_rows_forced_or_measured_on_a_cpu_open_as_eager_windows(tiny_dir, tmp_path, monkeypatch):
    """``--layout rows`` on a CPU: the windows run eagerly (no capture), at the measured row count
    where ``auto`` chose it; its vectors those of the default layout (bf16: every token's cosine
    >= 0.999 against fp32's)."""
    import numpy as np
    from elmo_core import batch_to_ids
    from tests.helpers import SENTENCES

    forced = resolve_run(tiny_dir, layout="rows", precision="bf16")
    assert (forced.layout.name, forced.layout.reason, forced.layout.rows) == ("rows", "asked for", None)
    ids = batch_to_ids(SENTENCES)
    with resolve_run(tiny_dir).open() as backend:
        want, mask = backend.run(ids)
    with forced.open() as backend:
        assert backend.fast.layout == "rows" and not backend.fast.graphs.capture
        got, got_mask = backend.run(ids)
    assert np.array_equal(mask, got_mask)
    a, b = want.transpose(0, 2, 1, 3)[mask].astype(np.float64), got.transpose(0, 2, 1, 3)[mask].astype(np.float64)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)  # (tokens, L+1)
    assert cos.min() >= 0.999
    measured = replace(forced, layout=Layout("rows", "rows 64 180 tokens/s", 64))
    assert "rows layout (at most 64 rows a step): rows 64 180" in measured.describe()
    with measured.open() as backend:
        assert backend.fast.graphs.shape.rows == 64
    assert measured.on_cpu().layout.rows is None


def test_auto_keeps_fp32_where_the_products_are_too_small_for_bf16_units(tiny_dir):
    """``--precision auto`` on a CPU with AMX takes bf16 only where the products run on packed oneDNN
    weights: the small ones ran slower in bf16 (docs/performance.md)."""
    from inference.fast_lstm import packed_products
    from inference.precision import SMALL_BF16

    run = resolve_run(tiny_dir, precision="auto", flags=frozenset({"amx_bf16", "avx512f"}))
    assert (run.precision, run.precision_reason) == ("fp32", SMALL_BF16)
    assert resolve_run(tiny_dir, precision="bf16", flags=frozenset({"amx_bf16", "avx512f"})).precision == "bf16"
    assert packed_products(_config(4096, 512)) and not packed_products(_config(512, 128))


def test_an_unknown_layout_exits_2_naming_the_flag(tmp_path):
    from tests.helpers import run_cli

    result = run_cli("embed", tmp_path / "in", tmp_path / "out", "--model", tmp_path, "--layout", "row")
    assert result.returncode == 2 and "--layout" in result.stderr and "rows" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


# bf16 on an AMX Xeon (full size, layouts.json): fused 1.23x packed on the recurrence
XEON_BF16 = {"packed": 2281.0, "fused": 2796.0, "rows 1024": 2539.0, "rows 64": 2199.0}


def test_a_compiled_layout_is_taken_only_by_a_job_that_repays_its_warm_up():
    """A job of 3,000 sentences (~43k tokens) ran fused 0.70x packed end to end on that Xeon: the
    compiled kernels' warm-up (~10 s a process) is repaid, counting only the gain beyond the
    margin, after 10 / (1/2,281 - 1.1/2,796) tokens."""
    repaid = 10.0 / (1 / 2281.0 - FUSED_MARGIN / 2796.0)
    assert 222_000 < repaid < 223_000
    short = choose(XEON_BF16, 10.0, 43_000)
    assert (short.name, short.rows, short.onednn) == ("packed", None, False)
    assert "fused's warm-up (~10 s a process) is repaid after ~222," in short.reason and "this job has ~43,000" in short.reason
    assert choose(XEON_BF16, 10.0, int(repaid) - 1).name == "packed"
    long = choose(XEON_BF16, 10.0, int(repaid) + 1)
    assert long.name == "fused" and f"this job has ~{int(repaid) + 1:,}" in long.reason
    assert choose(XEON_BF16, 10.0, None).name == "fused"  # a server, an Embedder: no end in sight
    assert choose(XEON_BF16, 0.0, 1).name == "fused"  # nothing to repay
    onednn = choose({"packed": 100.0, ONEDNN: 131.0, "fused": 200.0}, 5.0, 100)  # the eager base it keeps
    assert (onednn.name, onednn.onednn) == ("packed", True)
    assert choose({"packed": 0.0, "fused": 100.0}, 5.0, 1).name == "fused"  # no eager figure: nothing to keep
    edge = choose({"packed": 100.0, "fused": 100.0 * FUSED_MARGIN}, 5.0, 10**9)  # no gain beyond the margin
    assert edge.name == "packed" and "repaid by no job" in edge.reason
    assert choose({"packed": 100.0, "fused": 100.0 * FUSED_MARGIN}, 0.0, 1).name == "fused"  # nor any warm-up


def test_the_warm_up_is_measured_kept_and_weighed_against_the_job(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path))
    big, calls = _config(4096, 512), []

    def measure(config, precision, threads):
        calls.append(precision)
        return XEON_BF16, 10.0
    assert resolve_layout(None, "cpu", "bf16", big, 2, measure, tokens=43_000).name == "packed"
    assert resolve_layout(None, "cpu", "bf16", big, 2, measure, tokens=10**6).name == "fused"
    assert resolve_layout(None, "cpu", "bf16", big, 2, measure).name == "fused" and calls == ["bf16"]
    kept = next(iter(json.loads((tmp_path / "layouts.json").read_text()).values()))
    assert kept == {"tokens_per_s": XEON_BF16, "warmup_s": 10.0}
    (tmp_path / "layouts.json").write_text(json.dumps({key: XEON_BF16 for key in
                                                       json.loads((tmp_path / "layouts.json").read_text())}))
    assert resolve_layout(None, "cpu", "bf16", big, 2, measure).name == "fused" and len(calls) == 2  # no warm-up: again


def test_a_job_and_its_replicas_weigh_the_warm_up_against_its_inputs(tiny_dir, tmp_path, monkeypatch):
    """The job's expected tokens (its inputs' text bytes, ``pipelines.source.expected_tokens``) reach
    the run: a short job keeps the eager layout a long-lived run would not; a cluster's replicas,
    which settle ``auto`` where they run, weigh it against the same tokens."""
    from corpora.sample import write_sample_corpus
    from inference import layout
    from inference.run_settings import RunSettings
    from pipelines.claim_first import RunMaker
    from pipelines.job import plan_job
    from pipelines.options import EmbedOptions

    monkeypatch.setenv("ELMO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(layout, "MEASURED_MIN_WEIGHTS", 1)  # the tiny model measured (its figures given here)
    monkeypatch.setattr(layout, "measure_layouts", lambda config, precision, threads: (XEON_BF16, 10.0))
    write_sample_corpus(tmp_path / "corpus", rows=200, files=2)
    job = plan_job(tmp_path / "corpus", tmp_path / "out", RunMaker.of(tiny_dir, RunSettings(), remote=False),
                   EmbedOptions(quiet=True))
    try:
        assert 2_000 < job.run.expected_tokens < 200 * 40 and job.run.layout.name == "packed"
        assert f"this job has ~{job.run.expected_tokens:,}" in job.run.describe()
    finally:
        job.predictor.close()
    assert resolve_run(tiny_dir).layout.name == "fused"  # no job: no end in sight
    remote = resolve_run(tiny_dir, remote=True, expected_tokens=43_000)
    assert remote.layout.name == "auto" and remote.settled_layout().name == "packed"
    assert resolve_run(tiny_dir, remote=True, expected_tokens=10**6).settled_layout().name == "fused"
