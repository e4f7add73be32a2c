"""The dynamic batcher on its own: which sentences share a batch, the token budget, the wait,
the order results come back in, and a model error reaching every request of its batch.

A test sets the queue up by holding the model (``Recorder(hold=...)``) and waiting for the state it
needs (the model entered, the queue's depth), never by sleeping: on a busy machine a sleep may
end before the batcher's thread has run at all."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from serving.batcher import DynamicBatcher
from serving.errors import QueueFull
from elmo_core.errors import InputError
from serving.limits import ServeLimits
from tests.processes import POLL_S, WAIT_S


class Recorder:
    """A model function that answers each sentence with (spec, its tokens) and keeps every batch."""

    def __init__(self, fail_on: str | None = None, hold: threading.Event | None = None) -> None:
        self.batches: list[tuple[object, list[list[str]]]] = []
        self.fail_on, self.hold = fail_on, hold
        self.entered = threading.Event()  # the model thread has taken a batch

    def __call__(self, spec, sentences):  # type: ignore[no-untyped-def]
        self.entered.set()
        if self.hold is not None:
            self.hold.wait(WAIT_S)
        self.batches.append((spec, [list(s) for s in sentences]))
        if self.fail_on is not None and any(self.fail_on in s for s in sentences):
            raise RuntimeError("model failure")
        return [(spec, tuple(s)) for s in sentences]


def words(n: int, tag: str = "w") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    """Yield to the event loop until ``condition()``; AssertionError after ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not reached in {WAIT_S:.0f} s"
        await asyncio.sleep(POLL_S)


async def occupied(batcher: DynamicBatcher, rec: Recorder) -> asyncio.Future:
    """A one-sentence request of spec ``"hold"`` that the model thread has taken (and holds)."""
    first = asyncio.ensure_future(batcher.submit("hold", [["first"]]))
    await until(rec.entered.is_set, "the model took the first batch")
    return first


def test_results_come_back_per_request_in_order_and_specs_never_mix():
    hold = threading.Event()
    rec = Recorder(hold=hold)
    batcher = DynamicBatcher(rec, ServeLimits(max_wait_ms=50)).start()

    async def main():  # type: ignore[no-untyped-def]
        first = await occupied(batcher, rec)
        requests = [("a", [words(3, "x"), words(1, "y")]), ("b", [words(2, "z")]), ("a", [words(5, "q")])]
        answers = [asyncio.ensure_future(batcher.submit(spec, s)) for spec, s in requests]
        await until(lambda: batcher.depth == 4, "4 sentences queued")
        hold.set()
        return requests, await asyncio.gather(*answers), await first

    requests, answers, _ = run(main())
    batcher.close()
    for (spec, sentences), answer in zip(requests, answers):
        assert answer == [(spec, tuple(s)) for s in sentences]
    assert all(len({spec}) == 1 for spec, _ in rec.batches)
    assert sorted(len(b) for _, b in rec.batches[1:]) == [1, 3]  # the two 'a' requests shared a batch


def test_a_batch_keeps_to_the_token_budget_takes_the_oldest_and_groups_lengths():
    hold = threading.Event()
    rec = Recorder(hold=hold)
    limits = ServeLimits(max_batch_tokens=40, max_sentence_tokens=20, max_wait_ms=0)
    batcher = DynamicBatcher(rec, limits).start()
    lengths = [20, 2, 19, 3, 18, 2, 4, 20]

    async def main():  # type: ignore[no-untyped-def]
        first = await occupied(batcher, rec)
        rest = [asyncio.ensure_future(batcher.submit("s", [words(n, f"r{i}_")])) for i, n in enumerate(lengths)]
        await until(lambda: batcher.depth == len(lengths), "every sentence queued")
        hold.set()
        await asyncio.gather(first, *rest)

    run(main())
    batcher.close()
    batches = [[len(s) for s in b] for _, b in rec.batches[1:]]
    assert sorted(n for b in batches for n in b) == sorted(lengths)
    assert all(len(b) * max(b) <= 40 for b in batches), batches
    assert batches[0][0] == 20  # the oldest goes first, with its nearest lengths
    assert sorted(batches[0]) == [20, 20], batches  # its own length first; 3 x 20 > 40: full
    assert any(sorted(b) == [2, 2, 3, 4] for b in batches), batches  # the short ones together


def test_max_wait_gathers_requests_and_a_lone_one_waits_no_longer():
    """A queued sentence waits ``max_wait_ms`` for others (a minute here: the second request comes
    well within it), then runs: the lone one's batch starts after its wait, not sooner, and does
    not wait for a second request that never comes."""
    rec = Recorder()
    batcher = DynamicBatcher(rec, ServeLimits(max_wait_ms=60_000)).start()

    async def gathered():  # type: ignore[no-untyped-def]
        first = asyncio.ensure_future(batcher.submit("s", [["a"]]))
        await until(lambda: batcher.depth == 1, "the first request queued")
        second = asyncio.ensure_future(batcher.submit("s", [["b"]]))
        await until(lambda: batcher.depth == 2, "the second request queued")
        batcher.drain()  # no third: run them now, not after a minute
        return await asyncio.gather(first, second)

    assert run(gathered()) == [[("s", ("a",))], [("s", ("b",))]]
    batcher.close()
    assert [len(b) for _, b in rec.batches] == [2]

    lone = DynamicBatcher(Recorder(), ServeLimits(max_wait_ms=300)).start()

    async def alone():  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        await asyncio.wait_for(lone.submit("s", [["c"]]), WAIT_S)  # not waiting for a second one forever
        return time.monotonic() - t0

    assert run(alone()) >= 0.3  # an upper bound would time the machine's load, not the batcher
    lone.close()


def test_drain_runs_the_queued_sentences_at_once_and_takes_the_requests_in_flight():
    """At SIGTERM the server drains its batcher: no new request can join a batch, so none waits
    out ``max_wait_ms`` (a minute here; the test allows half of it); a request still in flight may
    queue its sentences and gets its answer."""
    rec = Recorder()
    batcher = DynamicBatcher(rec, ServeLimits(max_wait_ms=60_000)).start()

    async def main():  # type: ignore[no-untyped-def]
        queued = asyncio.ensure_future(batcher.submit("s", [["a"], ["b"]]))
        await until(lambda: batcher.depth == 2, "2 sentences queued")
        batcher.drain()
        return await asyncio.wait_for(queued, 30), await asyncio.wait_for(batcher.submit("s", [["late"]]), 30)

    assert run(main()) == ([("s", ("a",)), ("s", ("b",))], [("s", ("late",))])
    batcher.close()


def test_a_full_queue_refuses_the_whole_request():
    hold = threading.Event()
    rec = Recorder(hold=hold)
    batcher = DynamicBatcher(rec, ServeLimits(max_queue=4, max_request_sentences=4, max_wait_ms=0)).start()

    async def main():  # type: ignore[no-untyped-def]
        busy = asyncio.ensure_future(batcher.submit("s", [["a"]]))
        await until(rec.entered.is_set, "the model took the first batch")  # and holds it
        queued = asyncio.ensure_future(batcher.submit("s", [["b"]] * 3))
        await until(lambda: batcher.depth == 3, "3 sentences queued")
        with pytest.raises(QueueFull, match="max_queue 4"):
            await batcher.submit("s", [["c"]] * 2)
        assert batcher.depth == 3
        hold.set()
        return await asyncio.gather(busy, queued)

    busy, queued = run(main())
    batcher.close()
    assert busy == [("s", ("a",))] and queued == [("s", ("b",))] * 3


def test_a_model_error_reaches_every_request_of_its_batch_and_the_batcher_goes_on():
    hold = threading.Event()
    rec = Recorder(fail_on="boom", hold=hold)
    batcher = DynamicBatcher(rec, ServeLimits(max_wait_ms=100)).start()

    async def main():  # type: ignore[no-untyped-def]
        first = await occupied(batcher, rec)
        both = [asyncio.ensure_future(batcher.submit("s", [[word]])) for word in ("boom", "fine")]
        await until(lambda: batcher.depth == 2, "both requests queued")  # one batch when the model is free
        hold.set()
        await first
        return await asyncio.gather(*both, return_exceptions=True)

    answers = run(main())
    assert all(isinstance(a, RuntimeError) for a in answers), answers
    assert run(batcher.submit("s", [["after"]])) == [("s", ("after",))]
    batcher.close()


def test_a_gpu_server_batches_as_a_gpu_job_does(tiny_dir):
    """The batch budget is the run's unless given (``ModelRun.batch``, sized to the device): on an
    80 GB GPU whatever waits joins one batch of up to 131,072 padded tokens, as a job's batches."""
    from dataclasses import replace

    from inference.batching import gpu_budget
    from inference.model_run import resolve_run

    run = resolve_run(tiny_dir)
    gpu = replace(run, device="cuda:1", batch=gpu_budget(80 << 30, 4096, 512, 2, "an 80 GB card"))
    assert ServeLimits().batch_policy.max_tokens_per_batch == 4096  # no run: a CPU's least
    assert run.batch.tokens == 16384  # the tiny model's on a CPU: narrow (inference.batching.cpu_batch_budget)
    assert ServeLimits().on_run(gpu).batch_policy.max_tokens_per_batch == 131072
    assert ServeLimits().on_run(run).as_dict()["max_batch_tokens"] == 16384
    assert ServeLimits(max_batch_tokens=8192).on_run(gpu).max_batch_tokens == 8192  # given: kept
    with pytest.raises(InputError, match=r"max_sentence_tokens \(5000\) must be at most max_batch_tokens \(4096\)"):
        ServeLimits(max_sentence_tokens=5000)  # above the CPU's 4096 when no budget is given


def test_a_cpu_server_has_no_static_shapes_to_warm(tiny_dir):
    """The warm-up runs every route's work; the shapes it holds are the CUDA graphs' row counts,
    none on a CPU (tests/gpu holds a GPU server's: every count its batches may take)."""
    from inference.model_run import resolve_run
    from serving.service import SentencePredictor

    predictor = SentencePredictor(resolve_run(tiny_dir), ServeLimits())
    try:
        assert predictor.warm_up() == []
        assert predictor.embedder.policy.max_tokens_per_batch == 4096
    finally:
        predictor.close()
