"""Clients a public server meets, against a real ``elmo serve`` over real sockets: stalled and
half-closed connections, too many connections, API keys, CORS, truncation, /tokenize, the offline
API document, and every row of the error table produced by a real bad request."""
from __future__ import annotations

import selectors
import socket
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from inference import Embedder
from tests.helpers import TINY_OPTIONS, make_model_dir

from tests.processes import WAIT_S, wait_until

from .server_utils import ServerProcess, metric, reference

KEY = "s3cret-key"
AUTH = {"authorization": f"Bearer {KEY}"}
ORIGIN = "https://app.example"
DEADLINE_S = 3.0  # the server's header and body deadlines


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("clients") / "tiny", TINY_OPTIONS)


@pytest.fixture(scope="module")
def server(model: Path):
    srv = ServerProcess(model, "--api-key", KEY, "--cors-allow-origin", ORIGIN, "--max-sentence-tokens", "40",
                        "--header-timeout-s", str(DEADLINE_S), "--body-timeout-s", str(DEADLINE_S),
                        "--keep-alive-s", "1", "--max-request-sentences", "8")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def embedder(model: Path) -> Embedder:
    return Embedder.open(model)


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _post(url: str, path: str, body: dict, **kw) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.post(f"{url}{path}", json=body, headers=kw.pop("headers", AUTH), timeout=30, **kw)


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_stalled_connections_are_cut_at_their_deadline_and_others_are_served(server: ServerProcess):
    addr = _address(server.url)
    head = f"POST /embed HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
    stalls = {"idle": b"", "headers": head.encode(), "body": (head + "Content-Length: 100\r\n\r\n").encode() + b'{"te'}
    socks, opened = [], time.monotonic()
    for i in range(200):
        kind = list(stalls)[i % 3]
        s = socket.create_connection(addr, timeout=WAIT_S)
        s.sendall(stalls[kind])
        socks.append((kind, s))
    answer = _post(server.url, "/embed", {"texts": ["served meanwhile"]})
    answered = time.monotonic() - opened
    assert answer.status_code == 200, answer.text

    closed: dict[socket.socket, tuple[str, bytes, float]] = {}
    sel = selectors.DefaultSelector()
    for kind, s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, kind)
    replies: dict[socket.socket, bytes] = {}
    deadline = opened + DEADLINE_S + WAIT_S
    while len(closed) < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.1):
            s = key.fileobj
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                replies[s] = replies.get(s, b"") + chunk
                continue
            closed[s] = (key.data, replies.get(s, b""), time.monotonic() - opened)
            sel.unregister(s)
    for _, s in socks:
        s.close()
    assert len(closed) == 200, f"{200 - len(closed)} stalled connections still open after {DEADLINE_S + WAIT_S} s"
    for kind, reply, _ in closed.values():
        if kind == "idle":
            assert reply == b"", reply  # nothing was asked: closed without an answer
        else:
            assert reply.startswith(b"HTTP/1.1 408 ") and b'"request_timeout"' in reply, reply
    first_cut = min(t for *_, t in closed.values())
    assert first_cut >= DEADLINE_S - 0.05  # not before the deadline either
    # served while every stalled connection was still open: they did not hold the server up
    assert answered < first_cut, (answered, first_cut)
    text = httpx.get(f"{server.url}/metrics").text
    for phase, n in (("idle", 67), ("headers", 67), ("body", 66)):
        assert float(text.split(f'elmo_connections_cut_total{{phase="{phase}"}} ')[1].split()[0]) >= n


def test_a_client_that_half_closes_after_its_request_gets_its_answer(server: ServerProcess, embedder: Embedder):
    body = b'{"sentences": [["The", "cat", "sat"]]}'
    with socket.create_connection(_address(server.url), timeout=10) as s:
        s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (KEY.encode(), len(body), body))
        s.shutdown(socket.SHUT_WR)
        reply = _read_all(s)
    # the server's probe of a half-closed client (serving/server.py), sent where the answer had not begun when
    # the client's end arrived: under load the answer can be whole first, and then it comes alone
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    reply = reply.removeprefix(interim)
    assert reply.startswith(b"HTTP/1.1 200 "), reply[:200]
    got = np.asarray(httpx.Response(200, content=reply.split(b"\r\n\r\n", 1)[1]).json()["embeddings"][0], np.float32)
    # a server batch vs the sentence alone: fp32 sums in another order, a few ulp x the recurrence
    np.testing.assert_allclose(got, reference(embedder, ["The", "cat", "sat"]), atol=1e-5, rtol=0)


def test_the_api_key_guards_the_model_and_the_probes_stay_open(server: ServerProcess):
    openai = pytest.importorskip("openai", reason="the openai client (dev extra) is not installed")
    for headers, what in (({}, "no API key"), ({"authorization": "Bearer wrong"}, "a wrong API key")):
        refused = _post(server.url, "/embed", {"texts": ["a"]}, headers=headers)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"]["type"] == "unauthorized" and what in refused.json()["error"]["message"]
    assert _post(server.url, "/embed", {"texts": ["a"]}).status_code == 200
    for probe in ("/health", "/ready", "/metrics", "/openapi.json"):
        assert httpx.get(f"{server.url}{probe}").status_code == 200, probe
    assert httpx.get(f"{server.url}/info").status_code == 401
    good = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    assert len(good.embeddings.create(input="Hi there", model="elmo").data) == 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).embeddings.create(input="Hi", model="elmo")


def test_cors_preflight_and_answers_carry_the_allowed_origin(server: ServerProcess):
    preflight = httpx.options(f"{server.url}/v1/embeddings", headers={
        "origin": ORIGIN, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    answer = _post(server.url, "/embed", {"texts": ["a"]}, headers={**AUTH, "origin": ORIGIN})
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(f"{server.url}/embed", headers={"origin": "https://evil.example",
                                                          "access-control-request-method": "POST"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    assert other.json()["error"] == {"type": "cors", "message": "this server's CORS settings refuse this request's "
                                     "origin (elmo serve --cors-allow-origin names the origins it answers)"}


def test_truncation_on_request_and_the_413_without_it(server: ServerProcess, embedder: Embedder):
    long = " ".join(f"w{i}" for i in range(300))
    refused = _post(server.url, "/embed", {"texts": [long]})
    assert refused.status_code == 413 and "truncate" in refused.json()["error"]["message"]
    cut = _post(server.url, "/embed", {"texts": ["short one", long], "truncate": True}).json()
    assert cut["usage"] == {"sentences": 2, "tokens": 42, "truncated": 1}
    # a server batch vs the sentence alone: fp32 sums in another order, a few ulp x the recurrence
    np.testing.assert_allclose(np.asarray(cut["embeddings"][1], np.float32), reference(embedder, long.split()[:40]),
                               atol=1e-5, rtol=0)
    openai = _post(server.url, "/v1/embeddings", {"input": long, "truncate": True}).json()
    assert openai["usage"]["prompt_tokens"] == 40 and openai["usage"]["truncated"] == 1


def test_tokenize_shows_the_tokens_and_their_offsets(server: ServerProcess):
    text = "  The\u00a0cat\u3000sat\x1c.  "
    got = _post(server.url, "/tokenize", {"texts": [text, ""]}).json()
    assert got["tokens"] == [text.split(), []] == [["The", "cat", "sat", "."], []]
    assert [text[a:b] for a, b in got["offsets"][0]] == text.split()
    long = " ".join(["w"] * 50)
    assert _post(server.url, "/tokenize", {"texts": [long]}).status_code == 413
    assert _post(server.url, "/tokenize", {"texts": [long], "truncate": True}).json()["usage"]["tokens"] == 40


def test_the_api_document_is_served_without_a_cdn(server: ServerProcess):
    page = httpx.get(f"{server.url}/docs").text
    assert "cdn" not in page.lower() and "/docs-static/swagger-ui-bundle.js" in page
    script = httpx.get(f"{server.url}/docs-static/swagger-ui-bundle.js")
    assert script.status_code == 200 and len(script.content) > 100_000 and b"SwaggerUIBundle" in script.content


RAW_ERRORS = [  # (body bytes, status, words the message must hold)
    (b'{"texts": ["caf\xe9"]}', 422, "UTF-8"),
    (b'{"texts": ["a"], "gamma": 1' + b"0" * 5000 + b"}", 422, "not valid JSON"),
    (b'{"texts": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 422, "depth limit"),
    (b'{"texts": ["a"], "gamma": 1e308}', 422, "gamma"),
    (b'{"texts": ["a"], "gamma": -1e39}', 422, "gamma"),
    (b'{"texts": ["a"], "mix": [1e39, 0, 0]}', 422, "mix[0]"),
    (b'{"texts": ["a"], "output": "layer:1", "gamma": 5}', 422, "gamma only applies to the mix (output mixed)"),
    (b'{"texts": ["a"], "truncate": "yes"}', 422, "truncate"),
    (b'{"texts": ["a"], "gamma": "1"}', 422, "gamma"),  # numbers as numbers: no string or bool taken for one
    (b'{"texts": ["a"], "gamma": true}', 422, "gamma"),
    (b'{"texts": ["a"], "mix": ["1", "2", "3"]}', 422, "mix"),
    (b'{"texts": ["a"], "mix": [true, false, 1]}', 422, "mix"),
    ('{"texts": ["a"], "output": "layer:\u0661"}'.encode(), 422, "output"),  # an Arabic-Indic 1: not a layer
]


@pytest.mark.parametrize("body,status,words", RAW_ERRORS)
def test_each_raw_bad_body_gets_its_documented_error(server: ServerProcess, body: bytes, status: int, words: str):
    answer = httpx.post(f"{server.url}/embed", content=body, timeout=30,
                        headers={**AUTH, "content-type": "application/json"})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request" and words in error["message"], error


def test_vectors_scaled_past_float32_are_refused_naming_gamma():
    from serving.app import check_finite
    from serving.errors import InvalidRequest

    check_finite([np.ones((2, 4), np.float32), None])
    with pytest.raises(InvalidRequest, match="gamma"):  # a real model's values (~10) x gamma 3e38
        check_finite([np.ones((2, 4), np.float32), np.array([[np.inf, 1.0]], np.float32)])


def test_openai_inputs_the_sdk_refuses_are_422s(server: ServerProcess):
    openai = pytest.importorskip("openai", reason="the openai client (dev extra) is not installed")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    for bad, words in (([], "at least one string"), ([[1, 2, 3]], "token ids are not supported"),
                       ([5, 6], "token ids are not supported")):
        with pytest.raises(openai.UnprocessableEntityError) as error:
            client.embeddings.create(input=bad, model="elmo")
        assert words in str(error.value), error.value
    answer = httpx.post(f"{server.url}/v1/embeddings", json={"input": "a", "dimensions": "16"}, headers=AUTH, timeout=30)
    assert answer.status_code == 422 and "dimensions" in answer.json()["error"]["message"], answer.text


def _health(url: str) -> int | None:
    """GET /health's status; None where the connection was closed unanswered (over the cap)."""
    try:
        return httpx.get(f"{url}/health", timeout=WAIT_S).status_code
    except httpx.TransportError:
        return None


def test_connections_over_the_cap_are_refused_and_a_public_bind_warns(model: Path):
    srv = ServerProcess(model, "--host", "0.0.0.0", "--max-connections", "6", "--protect-probes", "--api-key", KEY)
    try:
        assert not any("no API key" in line for line in srv.stderr)
        url = srv.url.replace("0.0.0.0", "127.0.0.1")
        held = [socket.create_connection(_address(url), timeout=WAIT_S) for _ in range(6)]
        extra = socket.create_connection(_address(url), timeout=WAIT_S)
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            assert _read_all(extra) == b""  # closed as accepted, no answer
        except ConnectionResetError:
            pass
        for s in held + [extra]:
            s.close()
        wait_until(lambda: _health(url) is not None, "a new connection served once the held ones closed")
        assert _health(url) == 401  # --protect-probes
        text = httpx.get(f"{url}/metrics", headers=AUTH).text
        assert metric(text, "elmo_connections_refused_total") >= 1
    finally:
        srv.stop()
    open_srv = ServerProcess(model, "--host", "0.0.0.0", "--quiet")
    try:
        assert any("with no API key" in line for line in open_srv.stderr), open_srv.stderr
    finally:
        open_srv.stop()
