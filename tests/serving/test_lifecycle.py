"""The server under pressure and at its edges: a full queue, clients that go away, SIGTERM with
requests in flight and a stalled upload, readiness before the model is loaded, a model that fails
to load."""
from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from inference import Embedder
from serving.limits import ServeLimits
from serving.server import make_server
from inference.model_run import resolve_run
from serving.service import ServingState
from tests.helpers import SENTENCES, TINY_OPTIONS, make_model_dir

from .server_utils import ServerProcess, metric, reference

SLOW_BATCHES = ["--max-queue", "8", "--max-request-sentences", "4", "--max-wait-ms", "1500"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("lifecycle") / "tiny", TINY_OPTIONS)


@pytest.fixture(scope="module")
def embedder(model: Path) -> Embedder:
    return Embedder.open(model)


def _until(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _metrics(url: str) -> str:
    return httpx.get(f"{url}/metrics").text


def _check(answer: httpx.Response, sentences: list[list[str]], embedder: Embedder) -> None:
    assert answer.status_code == 200, answer.text
    for tokens, got in zip(sentences, answer.json()["embeddings"], strict=True):
        # a server batch (other rows beside it) vs the sentence alone: fp32 sums in another order, a few ulp x the recurrence
        np.testing.assert_allclose(np.asarray(got, np.float32), reference(embedder, tokens), atol=1e-5, rtol=0)


def test_a_full_queue_gives_503s_with_retry_after_and_correct_200s(model: Path, embedder: Embedder):
    server = ServerProcess(model, *SLOW_BATCHES)
    try:
        bodies = [SENTENCES[i % 5:] + SENTENCES[: i % 5] for i in range(6)]
        bodies = [b[:4] for b in bodies]  # 6 requests of 4 sentences; the queue holds 8 until the batch runs
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda b: httpx.post(f"{server.url}/embed", json={"sentences": b}, timeout=30),
                                    bodies))
        codes = sorted(a.status_code for a in answers)
        assert set(codes) <= {200, 503} and 200 in codes and 503 in codes, codes
        for body, answer in zip(bodies, answers):
            if answer.status_code == 503:
                assert answer.headers["retry-after"] == "1" and answer.json()["error"]["type"] == "queue_full"
                assert "max_queue" in answer.json()["error"]["message"]
            else:
                _check(answer, body, embedder)
        assert metric(_metrics(server.url), "elmo_queue_depth") == 0
    finally:
        server.stop()


def test_a_client_that_disconnects_leaves_the_queue(model: Path):
    server = ServerProcess(model, *SLOW_BATCHES)
    try:
        host, port = server.url.removeprefix("http://").split(":")
        body = b'{"sentences": [["a", "b"], ["c"], ["d", "e", "f"]]}'
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            _until(lambda: metric(_metrics(server.url), "elmo_queue_depth") == 3)
        _until(lambda: metric(_metrics(server.url), "elmo_cancelled_sentences_total") == 3, timeout=1.0)
        text = _metrics(server.url)
        assert metric(text, "elmo_queue_depth") == 0
        time.sleep(1.6)  # past the batch's deadline: nothing of it ran
        assert metric(_metrics(server.url), "elmo_sentences_total") == 0
        assert 'elmo_requests_total{route="/embed",status="499"} 1.0' in _metrics(server.url)
    finally:
        server.stop()


def _raw(url: str, head: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(head)
    return s


def _reply(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def test_sigterm_answers_requests_in_flight_cuts_a_stalled_upload_and_exits_0(model: Path, embedder: Embedder):
    server = ServerProcess(model, "--max-queue", "40", "--max-request-sentences", "2", "--max-wait-ms", "1500")
    assert psutil.Process(server.proc.pid).children(recursive=True) == []
    upload = b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"
    stalled = _raw(server.url, upload + b'{"texts": ["half')  # admitted: its body never comes
    bodies = [[SENTENCES[i % 5], SENTENCES[(i + 1) % 5]] for i in range(20)]  # 40 sentences: the queue is full
    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(httpx.post, f"{server.url}/embed", json={"sentences": b}, timeout=30) for b in bodies]
        _until(lambda: metric(_metrics(server.url), "elmo_queue_depth") == 40)
        started = time.monotonic()  # a full queue refuses before reading the body: none is sent here
        with _raw(server.url, upload) as early:
            refusal = _reply(early)
        assert refusal.split(b"\r\n")[0] == b"HTTP/1.1 503 Service Unavailable" and b"queue_full" in refusal
        assert time.monotonic() - started < 1.0
        server.terminate()
        terminated = time.monotonic()
        answers = [f.result() for f in futures]
    for body, answer in zip(bodies, answers):
        _check(answer, body, embedder)
    assert _reply(stalled).startswith(b"HTTP/1.1 503 "), "the stalled upload was not cut at SIGTERM"
    stalled.close()
    assert server.wait(30) == 0, "\n".join(server.stderr)
    # the queued batch waits 1.5 s (--max-wait-ms); the stalled upload's 30 s deadline is not waited for
    assert time.monotonic() - terminated < 10, time.monotonic() - terminated
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health", timeout=2)


class GatedState(ServingState):
    """A real ServingState whose loading waits for ``gate`` (to see the server before it is ready)."""

    def __init__(self, *args, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kw)
        self.gate = threading.Event()

    def _load(self) -> None:
        self.gate.wait(30)
        super()._load()


def test_ready_is_503_until_the_model_is_loaded_and_warm(model: Path):
    state = GatedState(resolve_run(model), ServeLimits())
    server, sock, url = make_server(state, quiet=True)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _until(lambda: server.started)
        assert httpx.get(f"{url}/health").status_code == 200
        not_ready = httpx.get(f"{url}/ready")
        assert not_ready.status_code == 503 and not_ready.headers["retry-after"] == "1"
        early = httpx.post(f"{url}/embed", json={"texts": ["too early"]})
        assert early.status_code == 503 and early.json()["error"]["type"] == "not_ready"
        state.gate.set()
        _until(lambda: httpx.get(f"{url}/ready").status_code == 200)
        assert httpx.post(f"{url}/embed", json={"texts": ["now then"]}).status_code == 200
    finally:
        state.gate.set()
        server.should_exit = True
        thread.join(30)
        sock.close()
    assert not thread.is_alive()


def test_a_model_that_fails_to_load_stops_the_server_with_its_error(tmp_path: Path):
    model = make_model_dir(tmp_path / "broken", TINY_OPTIONS)
    weights = model / "weights.hdf5"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(AssertionError, match="did not get ready") as failure:
        ServerProcess(model, timeout=60)
    assert "exit 2" in str(failure.value) and "weights.hdf5" in str(failure.value)


def test_bad_limits_are_refused_before_starting(model: Path):
    with pytest.raises(AssertionError, match="exit 2") as failure:
        ServerProcess(model, "--max-sentence-tokens", "500", "--max-batch-tokens", "100")
    assert "--max-sentence-tokens (500) must be at most --max-batch-tokens (100)" in str(failure.value)
