"""Host waits per batch of ``elmo embed``'s CUDA path, counted on the CPU (``bench/host_waits.py``;
``python bench/bench_gpu.py --proxy`` prints them): a count cannot flake, and a change that adds a
wait fails here. The host plans each batch (``inference.host_batch``), so the one wait left is the
result's copy to the host; the plan's batch equals the reference model's."""
from __future__ import annotations

import copy
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from host_waits import HostWaits, batch_waits, cuda_path_backend  # noqa: E402

from elmo_core import BiLM, ElmoConfig  # noqa: E402
from elmo_core.errors import InputError  # noqa: E402
from elmo_core.init import init_bilm  # noqa: E402
from bench.bench_bilm import bench_sentences  # noqa: E402
from inference import engine  # noqa: E402
from inference.backends import TorchBackend  # noqa: E402
from inference.batching import BatchPolicy  # noqa: E402
from elmo_core.vectors import VectorRequest  # noqa: E402
from tests.inference.test_gpu_proxy import SMALL  # noqa: E402

BATCHES = [[["the", "cat", "sat"], ["a", "cat"], ["x" * 60, "the"]], [["the", "dog"], ["cat"]],
           [["sat", "the", "cat", "and", "the", "dog", "ran"], ["a"]]]  # repeats across batches, a token over 50 chars


@pytest.fixture(scope="module")
def model() -> BiLM:
    return init_bilm(BiLM(ElmoConfig.from_dict(SMALL)), seed=0).eval()


def test_one_batch_of_the_cuda_path_waits_for_the_host_once(model):
    waits = batch_waits(cuda_path_backend(copy.deepcopy(model)), bench_sentences(64))
    assert dict(waits.by_kind) == {"Tensor.numpy": 1}, dict(waits.by_kind)  # the result, once


def test_only_the_devices_tensors_count():
    """A scalar read, a boolean selection and a copy of a device tensor count; the same of a host
    tensor (a batch's plan) does not; a pinned, non-blocking copy does not; a tensor made on a
    device from Python data does."""
    weight = torch.ones(3)
    host = torch.tensor([1.0, 2.0, 3.0])
    with HostWaits([weight]) as waits:
        on_device = weight * 2
        on_device.sum().item()
        _ = on_device[on_device > 1]
        on_device.tolist()
        host.sum().item()
        _ = host[host > 1]
        host.to("cpu")  # a copy to "the device" from pageable memory
        host.to("cpu", non_blocking=True)
        made = torch.tensor([1, 2], device="cpu")  # Python data to the device
        made.tolist()
    assert dict(waits.by_kind) == {"_local_scalar_dense": 1, "index": 1, "Tensor.tolist": 2,
                                   "copy to the device from pageable memory": 2}, dict(waits.by_kind)


def _backend(model: BiLM, layout: str, cache: int) -> TorchBackend:
    if layout == "rows":
        return cuda_path_backend(copy.deepcopy(model), token_cache=cache)
    return TorchBackend(copy.deepcopy(model), token_cache=cache, layout=layout)


@pytest.mark.parametrize("layout", ["packed", "rows"])
@pytest.mark.parametrize("cache", [0, 7, 50_000])  # none, too small for a batch's tokens, room for all
def test_the_host_planned_batch_equals_the_reference(model, layout, cache):
    """Batch after batch through ``TorchBackend.submit`` (the host's plan: distinct tokens, the
    cache's rows, the char-CNN's chunks, the rows) against the reference model: the mix, and every
    layer."""
    backend = _backend(model, layout, cache)
    request = VectorRequest("mixed", mix=(0.2, -0.3, 0.5))
    for sentences in BATCHES:
        ids = backend.tokenizer.batch(sentences)
        with torch.no_grad():
            layers, _ = model(torch.from_numpy(ids))  # (B, L+1, T, D) the reference (no fast path)
            mixed, _ = model.run_combined(torch.from_numpy(ids), torch.from_numpy(request.weights(3)))
        got = backend.submit(ids, request)()  # (B, T, D)
        np.testing.assert_allclose(got, mixed.numpy(), atol=2e-6, rtol=0)
        got = backend.submit(ids, VectorRequest("all"))()  # (B, T, L+1, D)
        np.testing.assert_allclose(got, layers.permute(0, 2, 1, 3).numpy(), atol=2e-6, rtol=0)
    if cache:
        held = backend.fast.token_cache
        assert held.filled == min(cache, held.misses) and held.hits > 0


def test_a_batch_that_is_refused_leaves_the_token_cache_as_it_was(model):
    backend = _backend(model, "rows", 50_000)
    backend.submit(backend.tokenizer.batch(BATCHES[0]), VectorRequest("mixed"))()
    cache = backend.fast.token_cache
    filled, index = cache.filled, dict(cache.index)
    bad = backend.tokenizer.batch([["new", "words"], ["more"]])
    bad[0, 0] = 0  # padding before a token
    with pytest.raises(InputError, match="left-aligned"):
        backend.submit(bad, VectorRequest("mixed"))
    ahead = backend.prepare(backend.tokenizer.batch(BATCHES[1]))  # planned, then not run
    backend.abandon(ahead)
    assert (cache.filled, cache.index) == (filled, index)


def test_the_next_batch_is_planned_on_a_thread_only_where_the_backend_computes_off_the_host(model):
    """On a CPU each batch's plan is made on the engine's thread (a thread would compete with the
    model's); where ``stages_ahead`` (CUDA), each next one on a thread while the current batch
    runs, with the same vectors."""
    backend = _backend(model, "rows", 50_000)
    assert backend.stages_ahead is False
    threads: list[str] = []
    prepare = backend.prepare
    backend.prepare = lambda ids: (threads.append(threading.current_thread().name), prepare(ids))[1]
    sentences = [s for batch in BATCHES for s in batch] * 3
    policy, request = BatchPolicy(max_sentence_length=8, max_tokens_per_batch=24), VectorRequest("mixed")
    here = engine.run(backend, engine.prepare(backend, sentences, policy), request)
    assert set(threads) == {threading.current_thread().name} and len(threads) > 2
    threads.clear()
    backend.stages_ahead = True
    ahead = engine.run(backend, engine.prepare(backend, sentences, policy), request)
    assert threads[0] == threading.current_thread().name and len(threads) > 2  # the first: nothing runs yet
    assert all(name.startswith("elmo-prepare") for name in threads[1:]), threads
    np.testing.assert_array_equal(ahead, here)
