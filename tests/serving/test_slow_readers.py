"""Clients that do not read, or read late, against a real ``elmo serve`` over real sockets: an
answer nobody takes is cut after ``--send-timeout-s`` (its connection and its bytes freed), a
refusal given before the body was read (413) reaches a client that reads only once it has sent
its body (``http.client``), pipelined requests of a half-closed connection are each answered, an
HTTP/1.0 client is sent no ``100 Continue``, bytes that are not HTTP get the API's JSON 400, and an
answer over ``--max-answer-values`` is refused before the model runs."""
from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import TINY_OPTIONS, make_model_dir
from tests.processes import WAIT_S, wait_until

from .server_utils import ServerProcess

SEND_TIMEOUT_S = 1.0
MAX_ANSWER = 1_000_000  # numbers: the tiny model's 64 x 256 tokens x 3 layers x 16 (786,432) fit


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    model = make_model_dir(tmp_path_factory.mktemp("slow_readers") / "tiny", TINY_OPTIONS)
    srv = ServerProcess(model, "--send-timeout-s", str(SEND_TIMEOUT_S), "--keep-alive-s", "1",
                        "--max-answer-values", str(MAX_ANSWER))
    yield srv
    srv.stop()


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _request(path: str, body: dict, *extra: str) -> bytes:
    data = json.dumps(body).encode()
    head = "".join(f"{h}\r\n" for h in extra)
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{head}"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(1 << 20):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def _cut_for_send(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    line = next((s for s in text.splitlines() if s.startswith('elmo_connections_cut_total{phase="send"}')), None)
    return float(line.split()[1]) if line else 0.0


def test_an_answer_nobody_reads_is_cut_after_the_send_timeout(server: ServerProcess):
    body = {"sentences": [[f"w{j}" for j in range(256)]] * 64, "output": "all"}  # ~9 MB of JSON back
    before = _cut_for_send(server.url)
    socks = []
    for _ in range(3):
        s = socket.create_connection(_address(server.url), timeout=WAIT_S)
        s.sendall(_request("/embed", body))  # and not a byte read
        socks.append(s)
    started = time.monotonic()
    wait_until(lambda: _cut_for_send(server.url) >= before + 3, timeout=WAIT_S + 4 * SEND_TIMEOUT_S,
               what="the three unread answers cut")
    assert time.monotonic() - started >= SEND_TIMEOUT_S - 0.05  # not before the deadline
    for s in socks:  # what the server still held of each answer is gone: the client gets less
        got = _read_all(s)
        s.close()
        assert got.startswith(b"HTTP/1.1 200 "), got[:100]
        head, _, rest = got.partition(b"\r\n\r\n")
        length = int(next(v for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")[1:])
                          if k.lower() == b"content-length"))
        assert len(rest) < length, (len(rest), length)
    assert httpx.post(f"{server.url}/embed", json={"texts": ["still served"]}, timeout=30).status_code == 200


def test_a_client_reading_steadily_is_not_cut(server: ServerProcess):
    """A client taking its answer at ~1.5 MB/s, never pausing a whole --send-timeout-s: the kernel
    frees room in its send queue in large steps (seconds apart at that rate), so progress is read
    from what the client acknowledged, not from the transport's buffer alone (which cut it)."""
    body = {"sentences": [[f"w{j}" for j in range(256)]] * 64, "output": "all"}  # ~9 MB of JSON back
    before = _cut_for_send(server.url)
    with socket.create_connection(_address(server.url), timeout=WAIT_S) as s:
        s.sendall(_request("/embed", body))
        got = b""
        while chunk := s.recv(64 << 10):
            got += chunk
            head, _, rest = got.partition(b"\r\n\r\n")
            if rest and len(rest) >= int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]):
                break
            time.sleep(0.04)
    assert len(rest) > 8_000_000 and json.loads(rest)["dim"] == 16
    assert _cut_for_send(server.url) == before


def test_a_413_reaches_a_client_that_reads_once_its_body_is_sent(server: ServerProcess):
    host, port = _address(server.url)
    big = json.dumps({"texts": ["word " * 1_200_000]}).encode()  # 6 MB, over the default 4 MiB
    for _ in range(3):
        conn = http.client.HTTPConnection(host, port, timeout=WAIT_S)
        conn.request("POST", "/embed", body=big, headers={"content-type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 413
        assert json.loads(reply.read())["error"]["type"] == "limit_exceeded"
        conn.close()


def test_each_pipelined_request_of_a_half_closed_connection_is_answered(server: ServerProcess):
    first = _request("/embed", {"texts": ["the first one"]})
    second = _request("/tokenize", {"texts": ["the second one"]})
    with socket.create_connection(_address(server.url), timeout=WAIT_S) as s:
        s.sendall(first + second)
        s.shutdown(socket.SHUT_WR)
        got = _read_all(s)
    assert got.count(b"HTTP/1.1 200 ") == 2, got[:300]
    assert b'"second"' in got


def test_an_http_1_0_client_that_half_closes_gets_no_100_continue(server: ServerProcess):
    data = json.dumps({"texts": ["old client"]}).encode()
    with socket.create_connection(_address(server.url), timeout=WAIT_S) as s:
        s.sendall(b"POST /embed HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (len(data), data))
        s.shutdown(socket.SHUT_WR)
        got = _read_all(s)
    assert got.startswith(b"HTTP/1.1 200 "), got[:200]
    assert b" 100 " not in got.split(b"\r\n", 1)[0]


@pytest.mark.parametrize("raw", [b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                                 b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
                                 b"GET /health HTTP/1.1\r\n\r\n"])  # no Host
def test_bytes_that_are_not_http_get_a_json_400(server: ServerProcess, raw: bytes):
    with socket.create_connection(_address(server.url), timeout=WAIT_S) as s:
        s.sendall(raw)
        got = _read_all(s)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"application/json" in head, got[:300]
    assert json.loads(body)["error"]["type"] == "invalid_request"


def test_an_answer_over_max_answer_values_is_refused_before_it_is_computed(server: ServerProcess):
    sentences = [[f"w{j}" for j in range(256)]] * 100  # 25,600 tokens x 3 layers x 16 = 1,228,800 numbers
    answer = httpx.post(f"{server.url}/embed", json={"sentences": sentences, "output": "all"}, timeout=30)
    assert answer.status_code == 413, answer.text
    error = answer.json()["error"]
    assert error["type"] == "limit_exceeded" and "1,228,800 numbers" in error["message"]
    assert "max_answer_values (1,000,000)" in error["message"]
    for fits in ({"output": "mixed"}, {"output": "all", "pool": "mean"}):  # 409,600 and 4,800 numbers
        assert httpx.post(f"{server.url}/embed", json={"sentences": sentences, **fits}, timeout=30).status_code == 200
