"""The server under pressure and at its edges: a full queue, clients that go away, SIGTERM with
requests in flight and a stalled upload, readiness before the model is loaded, a model that fails
to load.

Each test waits for the state it needs (the queue's depth, a counter), never for a time: a batch
that should wait is told to wait a minute (``--max-wait-ms 60000``; SIGTERM runs it at once), and
a prompt answer is told apart by what it says (a 503 at SIGTERM, not the 408 of a deadline set an
hour away). Every server is stopped by the ``serve`` fixture, also when a test fails."""
from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from inference import Embedder
from serving.limits import ConnectionLimits, ServeLimits
from serving.server import make_server
from inference.model_run import resolve_run
from serving.service import SentencePredictor, ServingState
from tests.helpers import SENTENCES, TINY_OPTIONS, make_model_dir
from tests.processes import WAIT_S, wait_until

from .server_utils import metric, reference

HELD_BATCHES = ["--max-wait-ms", "60000"]  # a queued batch waits a minute for others: the tests' states hold


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("lifecycle") / "tiny", TINY_OPTIONS)


@pytest.fixture(scope="module")
def embedder(model: Path) -> Embedder:
    return Embedder.open(model)


def _metrics(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=WAIT_S).text


def _until_metric(url: str, name: str, value: float) -> None:
    wait_until(lambda: metric(_metrics(url), name) == value, f"{name} == {value}")


def _check(answer: httpx.Response, sentences: list[list[str]], embedder: Embedder) -> None:
    assert answer.status_code == 200, answer.text
    for tokens, got in zip(sentences, answer.json()["embeddings"], strict=True):
        # a server batch (other rows beside it) vs the sentence alone: fp32 sums in another order, a few ulp x the recurrence
        np.testing.assert_allclose(np.asarray(got, np.float32), reference(embedder, tokens), atol=1e-5, rtol=0)


def test_a_full_queue_gives_503s_with_retry_after_and_correct_200s(model: Path, embedder: Embedder, serve):
    server = serve(model, "--max-queue", "8", "--max-request-sentences", "4", *HELD_BATCHES)
    bodies = [(SENTENCES[i % 5:] + SENTENCES[: i % 5])[:4] for i in range(3)]  # 3 requests of 4 sentences
    with ThreadPoolExecutor(2) as pool:
        admitted = [pool.submit(httpx.post, f"{server.url}/embed", json={"sentences": b}, timeout=WAIT_S)
                    for b in bodies[:2]]
        _until_metric(server.url, "elmo_queue_depth", 8)  # the queue is full: its batch waits a minute
        refused = httpx.post(f"{server.url}/embed", json={"sentences": bodies[2]}, timeout=WAIT_S)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1" and refused.json()["error"]["type"] == "queue_full"
        assert "max_queue" in refused.json()["error"]["message"]
        server.terminate()  # SIGTERM: the queued batch runs now, its requests are answered
        answers = [f.result() for f in admitted]
    for body, answer in zip(bodies[:2], answers, strict=True):
        _check(answer, body, embedder)
    assert server.wait() == 0, "\n".join(server.stderr)


def test_a_client_that_disconnects_leaves_the_queue(model: Path, serve):
    server = serve(model, *HELD_BATCHES)
    host, port = server.url.removeprefix("http://").split(":")
    body = b'{"sentences": [["a", "b"], ["c"], ["d", "e", "f"]]}'
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as s:
        s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        _until_metric(server.url, "elmo_queue_depth", 3)  # queued; its batch waits a minute
    _until_metric(server.url, "elmo_cancelled_sentences_total", 3)
    text = _metrics(server.url)
    assert metric(text, "elmo_queue_depth") == 0
    wait_until(lambda: 'elmo_requests_total{route="/embed",status="499"} 1.0' in _metrics(server.url), "a 499 logged")
    assert metric(_metrics(server.url), "elmo_sentences_total") == 0  # out of the queue before its batch ran


def _raw(url: str, head: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=WAIT_S)
    s.sendall(head)
    return s


def _reply(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def test_sigterm_answers_requests_in_flight_cuts_a_stalled_upload_and_exits_0(model: Path, embedder: Embedder,
                                                                              serve):
    # a stalled body would be cut at its deadline an hour away, and the server may take an hour to
    # drain: an answer within this test's bounds comes from SIGTERM itself
    server = serve(model, "--max-queue", "40", "--max-request-sentences", "2", *HELD_BATCHES,
                   "--body-timeout-s", "3600", "--shutdown-timeout-s", "3600")
    assert psutil.Process(server.proc.pid).children(recursive=True) == []
    upload = b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"
    stalled = _raw(server.url, upload + b'{"texts": ["half')  # admitted: its body never comes
    bodies = [[SENTENCES[i % 5], SENTENCES[(i + 1) % 5]] for i in range(20)]  # 40 sentences: the queue is full
    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(httpx.post, f"{server.url}/embed", json={"sentences": b}, timeout=WAIT_S)
                   for b in bodies]
        _until_metric(server.url, "elmo_queue_depth", 40)
        # a full queue refuses before reading the body: none is sent here, and the body deadline is an hour
        with _raw(server.url, upload) as early:
            refusal = _reply(early)
        assert refusal.split(b"\r\n")[0] == b"HTTP/1.1 503 Service Unavailable" and b"queue_full" in refusal
        server.terminate()
        answers = [f.result() for f in futures]
    for body, answer in zip(bodies, answers):
        _check(answer, body, embedder)
    cut = _reply(stalled)
    assert cut.startswith(b"HTTP/1.1 503 ") and b"shutting down" in cut, cut  # cut at SIGTERM: not a 408
    stalled.close()
    assert server.wait() == 0, "\n".join(server.stderr)  # without waiting for the hour-long deadlines
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health", timeout=WAIT_S)


class GatedState(ServingState):
    """A real ServingState whose loading waits for ``gate`` (to see the server before it is ready)."""

    def __init__(self, *args, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kw)
        self.gate = threading.Event()

    def _load(self) -> None:
        self.gate.wait(WAIT_S)
        super()._load()


class HeldPredictor(SentencePredictor):
    """A real predictor whose batches, once ``hold`` is set, wait for ``release`` (after the warm-up)."""

    def __init__(self, *args, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kw)
        self.hold, self.running, self.release = threading.Event(), threading.Event(), threading.Event()

    def __call__(self, spec, sentences):  # type: ignore[no-untyped-def]
        if self.hold.is_set():
            self.running.set()
            self.release.wait(WAIT_S)
        return super().__call__(spec, sentences)


class HeldState(ServingState):
    predictor_class = HeldPredictor


def test_requests_past_the_shutdown_deadline_get_a_503_and_leave_the_queue(model: Path):
    """At ``--shutdown-timeout-s`` uvicorn cancels what is still running: a request whose batch is in
    the model and one queued behind it are answered 503 (JSON, counted as such), not uvicorn's plain
    500, and the queued one's sentences leave the queue at once instead of running at close."""
    state = HeldState(resolve_run(model), ServeLimits())
    server, sock, url = make_server(state, quiet=True, connections=ConnectionLimits(shutdown_timeout_s=0.3))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(state.wait_ready, "the model is ready")
        state.predictor.hold.set()
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(httpx.post, f"{url}/embed", json={"texts": ["in the model"]}, timeout=WAIT_S)
            wait_until(state.predictor.running.is_set, "a batch is in the model")
            queued = pool.submit(httpx.post, f"{url}/embed", json={"texts": ["a", "b c"], "pool": "mean"},
                                 timeout=WAIT_S)
            wait_until(lambda: state.batcher.depth == 2, "the second request is queued")
            server.should_exit = True  # what SIGTERM does
            answers = [running.result(), queued.result()]
        for answer in answers:
            assert answer.status_code == 503 and answer.headers["content-type"] == "application/json", answer.text
            assert answer.json()["error"]["type"] == "not_ready" and "--shutdown-timeout-s" in answer.text
        assert state.batcher.depth == 0 and 'elmo_requests_total{route="/embed",status="503"} 2.0' in \
            state.metrics.render().decode()
    finally:
        state.predictor.release.set()
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()
    assert not thread.is_alive()


def test_ready_is_503_until_the_model_is_loaded_and_warm(model: Path):
    state = GatedState(resolve_run(model), ServeLimits())
    server, sock, url = make_server(state, quiet=True)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "the server started")
        assert httpx.get(f"{url}/health").status_code == 200
        not_ready = httpx.get(f"{url}/ready")
        assert not_ready.status_code == 503 and not_ready.headers["retry-after"] == "1"
        early = httpx.post(f"{url}/embed", json={"texts": ["too early"]})
        assert early.status_code == 503 and early.json()["error"]["type"] == "not_ready"
        state.gate.set()
        wait_until(lambda: httpx.get(f"{url}/ready").status_code == 200, "/ready answers 200")
        assert httpx.post(f"{url}/embed", json={"texts": ["now then"]}).status_code == 200
    finally:
        state.gate.set()
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()
    assert not thread.is_alive()


def test_a_model_that_fails_to_load_stops_the_server_with_its_error(tmp_path: Path, serve):
    model = make_model_dir(tmp_path / "broken", TINY_OPTIONS)
    weights = model / "weights.hdf5"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(AssertionError, match="did not get ready") as failure:
        serve(model)
    assert "exit 2" in str(failure.value) and "weights.hdf5" in str(failure.value)


def test_bad_limits_are_refused_before_starting(model: Path, serve):
    with pytest.raises(AssertionError, match="exit 2") as failure:
        serve(model, "--max-sentence-tokens", "500", "--max-batch-tokens", "100")
    assert "--max-sentence-tokens (500) must be at most --max-batch-tokens (100)" in str(failure.value)
