"""Each direction of the biLM on a thread of its own (``inference.directions``): every CPU layout, on
packed weights or on plain batched products (a small model's), gives the reference's vectors; the
directions meet once a layer (once a window and layer in the ``rows`` layout), each on half the
threads, on threads other than the caller's; an odd count, one thread or ``directions=False`` keeps
one team; a failing direction's error is raised once both are done; a forked process gets threads of
its own; idle direction threads never keep a process alive."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from formats import load_bilm
from inference.directions import DirectionThreads, split
from inference.packed_gemm import packed_gemm_available
from tests.helpers import SENTENCES, TINY_OPTIONS, make_model_dir, tiny_options
from tests.reference_impl import ReferenceElmo

pytestmark = pytest.mark.skipif(not packed_gemm_available(torch.device("cpu")),
                                reason="this torch build has no oneDNN pre-packed linear (non-x86 CPU)")
VARIANTS = {"default": TINY_OPTIONS, "three_layers": tiny_options(lstm__n_layers=3),
            "no_clipping": tiny_options(lstm__cell_clip=0, lstm__proj_clip=0)}


PLAIN = 1 << 62  # packed_min_weights no matrix reaches: the steps' products batched over the directions (MKL)


def _fast(model, layout: str, directions: bool = True, packed_min_weights: int = 0):  # type: ignore[no-untyped-def]
    from inference.fast_path import FastInference
    from inference.row_shape import RowShape

    return FastInference(model, layout=layout, packed_min_weights=packed_min_weights, capture=False,
                         rows=RowShape(4, 3), directions=directions)


def _meetings(fast) -> list[list[tuple[int, int, bool]]]:  # type: ignore[no-untyped-def]
    """Each time the directions met: (direction, its torch threads, on a thread not the caller's)."""
    pool, met = fast.lstm.directions, []
    real = pool.run

    def run(fn):  # type: ignore[no-untyped-def]
        caller, seen = threading.get_ident(), []

        def task(d: int) -> None:
            seen.append((d, torch.get_num_threads(), threading.get_ident() != caller))
            fn(d)
        real(task)
        met.append(sorted(seen))
    pool.run = run
    return met


def _layers(model, sentences):  # type: ignore[no-untyped-def]
    from elmo_core import batch_to_ids

    with torch.inference_mode():
        return model.run(torch.from_numpy(batch_to_ids(sentences))).layers.numpy()


@pytest.mark.parametrize("layout, packed_min_weights", [("packed", 0), ("fused", 0), ("packed", PLAIN)])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_directions_on_threads_of_their_own_give_the_reference(name, layout, packed_min_weights, tmp_path):
    options = VARIANTS[name]
    model_dir = make_model_dir(tmp_path / name, options, seed=3, lstm_scale=2.0)
    model = load_bilm(model_dir)
    torch.set_num_threads(2)  # the conftest fixture restores the count
    fast = _fast(model, layout, packed_min_weights=packed_min_weights)
    model.use_fast_path(fast)
    met = _meetings(fast)
    layers = _layers(model, SENTENCES)
    ref = ReferenceElmo(options, str(model_dir / "weights.hdf5"))
    for b, sent in enumerate(SENTENCES):  # fp32 against float64: the recurrence's rounding (~1e-6)
        np.testing.assert_allclose(layers[b, :, : len(sent)], ref.layers(sent), atol=1e-5, rtol=1e-5)
    assert met == [[(0, 1, True), (1, 1, True)]] * options["lstm"]["n_layers"]  # once a layer, one thread each


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_rows_directions_meet_once_a_window_and_give_one_teams_vectors(name, tmp_path):
    """The ``rows`` layout's windows (``combine``; one team's windows are held to the reference in
    tests/inference/test_cuda_graphs.py)."""
    options = VARIANTS[name]
    model = load_bilm(make_model_dir(tmp_path / name, options, seed=3, lstm_scale=2.0))
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([23, 9, 2, 14, 5])  # the tokens and both boundaries
    x = torch.randn(5, 23, options["lstm"]["projection_dim"], generator=gen) * (torch.arange(23) < lengths[:, None])[..., None]
    weights = torch.tensor([0.2, 0.3, 0.5, 0.1][: options["lstm"]["n_layers"] + 1])
    outs, met = [], []
    for directions in (True, False):
        fast = _fast(model, "rows", directions)
        if directions:
            met = _meetings(fast)
        with fast.running():
            outs.append(fast.combine(x, lengths, weights).numpy())
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-6, rtol=1e-6)  # the same ops on fewer threads
    windows = fast.graphs.positions // (fast.graphs.shape.steps * next(iter(fast.graphs.windows)))
    assert windows >= 8 and met == [[(0, 1, True), (1, 1, True)]] * (windows * options["lstm"]["n_layers"])


@pytest.mark.parametrize("threads, directions", [(1, True), (3, True), (2, False)])
def test_one_team_where_the_threads_do_not_split_evenly_or_it_is_off(threads, directions, tiny_dir):
    model = load_bilm(tiny_dir)
    torch.set_num_threads(threads)
    fast = _fast(model, "fused", directions)
    model.use_fast_path(fast)
    if directions:
        met = _meetings(fast)
    _layers(model, SENTENCES)
    assert not fast.lstm.split_directions() and (not directions or met == [])
    assert [split(n) for n in (1, 2, 3, 4, 6)] == [False, True, False, True, True]


@pytest.mark.parametrize("layout, packed_min_weights", [("fused", 0), ("packed", PLAIN)])
def test_bf16_directions_on_threads_of_their_own_match_one_team(layout, packed_min_weights, tiny_dir):
    from inference.precision import cpu_bf16

    if packed_min_weights == 0 and not cpu_bf16().onednn:
        pytest.skip("oneDNN runs no bf16 products on this CPU: the bf16 path keeps its batched products")
    from inference.fast_path import FastInference

    model = load_bilm(tiny_dir)
    torch.set_num_threads(2)
    outs = []
    for directions in (True, False):
        model.use_fast_path(FastInference(model, "bf16", layout=layout, packed_min_weights=packed_min_weights,
                                          directions=directions))
        assert model.fast_path.lstm.split_directions() == directions
        with model.fast_path.running():
            outs.append(_layers(model, SENTENCES))
    a, b = (o.reshape(-1, o.shape[-1]) for o in outs)
    keep = np.abs(b).sum(-1) > 0
    cosine = (a[keep] * b[keep]).sum(-1) / np.linalg.norm(a[keep], axis=-1) / np.linalg.norm(b[keep], axis=-1)
    assert cosine.min() >= 0.9999  # the same bf16 products, split over other threads: accumulation order only


def test_a_failing_direction_is_raised_once_both_are_done():
    pool, finished = DirectionThreads(), []

    def fn(d: int) -> None:
        if d == 0:
            raise ValueError("direction 0 failed")
        time.sleep(0.2)
        finished.append(torch.is_inference_mode_enabled())
    with torch.inference_mode(), pytest.raises(ValueError, match="direction 0 failed"):
        pool.run(fn)
    assert finished == [True]  # the other direction ran to its end, in the caller's inference mode


def test_a_forked_process_gets_threads_of_its_own():
    pool, seen = DirectionThreads(), []
    pool.run(seen.append)
    pid = os.fork()
    if pid == 0:  # the child: the parent's pool threads are not here
        done: list[int] = []
        worker = threading.Thread(target=pool.run, args=(done.append,), daemon=True)
        worker.start()
        worker.join(30)
        os._exit(0 if sorted(done) == [0, 1] else 1)
    _, status = os.waitpid(pid, 0)
    assert sorted(seen) == [0, 1] and os.waitstatus_to_exitcode(status) == 0


def test_a_thread_started_after_the_directions_ran_gets_the_callers_count():
    """torch keeps one process-wide count that a thread takes when it first runs torch: the directions'
    own count must not become it."""
    torch.set_num_threads(2)
    DirectionThreads().run(lambda d: None)
    fresh: list[int] = []
    later = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    later.start()
    later.join()
    assert fresh == [2] and torch.get_num_threads() == 2


def test_the_direction_threads_never_keep_a_process_alive(tmp_path):
    """The CLI joins every thread that is not a daemon before it exits (``elmo_cli.main.exit_now``):
    idle direction threads must not be among them, or every command that split its directions hangs."""
    import subprocess
    import sys

    script = ("import inference, threading, torch; from inference.directions import DirectionThreads; "
              "from elmo_cli.main import exit_now; torch.set_num_threads(2); DirectionThreads().run(lambda d: None); "
              "assert [t.daemon for t in threading.enumerate() if t.name.startswith('elmo-direction')] == [True, True]; "
              "exit_now(7)")
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 7, done.stderr[-2000:]
