"""The engine (``inference.engine``): every output mode, pooled or not, unit length or not, done on
the backend's side of the copy, against the host references (``reduce_layers`` per batch,
``pool_ragged``, ``unit_length``) on sentences cut into windows spread over several batches."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from elmo_core.pooling import pool_ragged
from inference import engine
from inference.backends import TorchBackend
from inference.batching import BatchPolicy
from inference.outputs import unit_length
from elmo_core.vectors import VectorRequest
from tests.helpers import SENTENCES

POLICY = BatchPolicy(max_sentence_length=6, window_context=1, max_tokens_per_batch=24)  # windows, many batches
ROWS = [*SENTENCES, [], None, ["lone"], [f"t{k}" for k in range(40)]]  # a null row, an empty one, a long one
EPS = 2.0 ** -24  # float32 unit roundoff


class Recording:
    """A backend that records what crosses the copy: each batch's ids shape and result shape."""

    def __init__(self, backend: TorchBackend) -> None:
        self.backend, self.calls = backend, []
        self.config, self.tokenizer, self.stages_ahead = backend.config, backend.tokenizer, backend.stages_ahead

    def check_request(self, request: VectorRequest) -> None:
        self.backend.check_request(request)

    def prepare(self, ids: np.ndarray) -> object | None:
        return self.backend.prepare(ids)

    def abandon(self, prepared: object | None) -> None:
        self.backend.abandon(prepared)

    def submit(self, ids: np.ndarray, request: VectorRequest, keep: np.ndarray | None = None,
               prepared: object | None = None, take: np.ndarray | None = None) -> Callable[[], np.ndarray]:
        result = self.backend.submit(ids, request, keep, prepared, take)
        got = result()
        self.calls.append((ids.shape, got.shape))
        return lambda: got


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> Recording:
    from tests.helpers import TINY_OPTIONS, make_model_dir

    return Recording(TorchBackend.from_files(make_model_dir(tmp_path_factory.mktemp("engine") / "tiny", TINY_OPTIONS)))


def _tokens(backend: Recording, output: str) -> np.ndarray:
    """The reference token vectors: the engine's own plan, layers reduced on the host."""
    return engine.run(backend, engine.prepare(backend, ROWS, POLICY), VectorRequest(output))  # (N, [L+1,] D)


@pytest.mark.parametrize("output", ["all", "mixed", "top", "average"])
@pytest.mark.parametrize("pool", [None, "mean", "max"])
@pytest.mark.parametrize("normalize", [False, True])
def test_pooling_and_unit_length_on_the_device_equal_the_host_references(backend, output, pool, normalize):
    lengths = np.array([-1 if r is None else len(r) for r in ROWS])  # (R,)
    tokens = _tokens(backend, output)
    backend.calls.clear()
    got = engine.run(backend, engine.prepare(backend, ROWS, POLICY), VectorRequest(output, pool=pool,
                                                                                   normalize=normalize))
    want = tokens if pool is None else pool_ragged(tokens, lengths, pool)  # (N or R, [L+1,] D)
    want = unit_length(want) if normalize else want
    # What crossed the copy: pooled, one vector (per layer) per batch row, never the batch's tokens;
    # else each token once: no padding, no window's context.
    if pool is None:
        assert sum(shape[0] for _, shape in backend.calls) == sum(n for n in lengths if n > 0)
    for (B, T, _), shape in backend.calls:
        assert B * T <= POLICY.max_tokens_per_batch
        assert shape[0] == B if pool else shape[0] <= B * T
        assert shape[1:] == (*((backend.config.n_output_layers,) if output == "all" else ()),
                             backend.config.output_dim)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.array_equal(np.isnan(got), np.isnan(want))  # the null, the empty row: NaN, for the doors' None
    # A pooled mean sums at most n = 40 float32 terms in another order (device per window, then
    # the windows in float64): |difference| <= n * eps * max|x|. Unit length divides by a norm
    # computed in float32 on the device (float64 on the host): a few eps relative, on |v| <= 1.
    bound = (40 if pool == "mean" else 4) * EPS * max(1.0, float(np.nanmax(np.abs(tokens))))
    np.testing.assert_allclose(got, want, atol=bound, rtol=0)


def test_float16_is_cast_on_the_device_from_the_float32_vectors(backend):
    request = VectorRequest("mixed", dtype="float16")
    got = engine.run(backend, engine.prepare(backend, ROWS, POLICY), request)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, _tokens(backend, "mixed").astype(np.float16))


def test_bad_requests_are_named():
    from elmo_core.errors import InputError

    for kwargs, message in (({"output": "middle"}, "output must be one of"), ({"pool": "sum"}, "pool must be"),
                            ({"dtype": "int8"}, "dtype must be one of")):
        with pytest.raises(InputError, match=message):
            VectorRequest(**kwargs)
