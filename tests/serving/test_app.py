"""``elmo serve`` answered over real HTTP: every sentence gets exactly its own vectors under
concurrency, every error code comes from a real bad request, and the server outlives them all."""
from __future__ import annotations

import random
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from inference import Embedder
from tests.helpers import SENTENCES, TINY_OPTIONS, make_model_dir
from tests.processes import WAIT_S

from .server_utils import ServerProcess, decode, metric, raw_reply, reference

LIMITS = ["--max-request-sentences", "8", "--max-sentence-tokens", "40", "--max-body-bytes", "20000",
          "--max-queue", "256", "--max-batch-tokens", "400", "--max-wait-ms", "20"]
L1, D = 3, 2 * TINY_OPTIONS["lstm"]["projection_dim"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("serve") / "tiny", TINY_OPTIONS)


@pytest.fixture(scope="module")
def server(model: Path):
    srv = ServerProcess(model, *LIMITS)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def embedder(model: Path) -> Embedder:
    return Embedder.open(model)


def _corpus(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    words = [t for s in SENTENCES for t in s]
    return [[rng.choice(words) for _ in range(rng.randint(1, 40))] for _ in range(n)]


def _request(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/embed", json=body, timeout=60)


def test_concurrent_requests_get_exactly_their_own_sentences(server: ServerProcess, embedder: Embedder):
    rng = random.Random(0)
    corpus = _corpus(120, seed=1) + SENTENCES + [[]]
    bodies = []
    for _ in range(40):
        output = rng.choice(["mixed", "top", "average", "all"])
        body = {"sentences": rng.sample(corpus, rng.randint(1, 8)), "output": output,
                "pool": rng.choice(["none", None, "mean", "max"]), "encoding": rng.choice(["float", "base64"])}  # null: none
        if output == "mixed" and rng.random() < 0.5:
            body |= {"mix": [rng.uniform(-1, 1) for _ in range(L1)], "gamma": rng.uniform(0.5, 2)}
        bodies.append(body)
    before = metric(httpx.get(f"{server.url}/metrics").text, "elmo_batch_sentences_count")
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda b: _request(server.url, b), bodies))
    for body, answer in zip(bodies, answers):
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert got["dim"] == D and len(got["embeddings"]) == len(body["sentences"])
        assert got["usage"] == {"sentences": len(body["sentences"]), "tokens": sum(map(len, body["sentences"])), "truncated": 0}
        pool_ = None if body["pool"] in ("none", None) else body["pool"]
        for tokens, value in zip(body["sentences"], got["embeddings"]):
            want = reference(embedder, tokens, body["output"], pool_, body.get("mix"), body.get("gamma", 1.0))
            if want is None:
                assert value is None
                continue
            # a server batch (other rows beside it) vs the sentence alone: fp32 sums in another order, a few ulp x the recurrence
            np.testing.assert_allclose(decode(value, body["encoding"], want.shape), want, atol=1e-5, rtol=0)
    sentences = sum(len(b["sentences"]) for b in bodies)
    batches = metric(httpx.get(f"{server.url}/metrics").text, "elmo_batch_sentences_count") - before
    assert batches < sentences, f"{sentences} sentences ran in {batches} batches: nothing was batched"


def test_texts_are_whitespace_split(server: ServerProcess, embedder: Embedder):
    got = _request(server.url, {"texts": ["The cat  sat\ton the mat ."], "output": "top"}).json()
    want = reference(embedder, "The cat sat on the mat .".split(), "top")
    # a server batch (other rows beside it) vs the sentence alone: fp32 sums in another order, a few ulp x the recurrence
    np.testing.assert_allclose(np.asarray(got["embeddings"][0], np.float32), want, atol=1e-5, rtol=0)


def test_tf_hub_output_names_and_single_layers(server: ServerProcess, embedder: Embedder):
    """word_emb / lstm_outputs1 / lstm_outputs2 are layers 0 / 1 / 2 (layer:N), default the mean pool of the mix."""
    sentence = "The cat sat on the mat .".split()
    layers = reference(embedder, sentence, "all")  # (L+1, T, D)
    for name, layer in (("word_emb", 0), ("lstm_outputs1", 1), ("layer:2", 2)):
        got = _request(server.url, {"sentences": [sentence], "output": name}).json()
        np.testing.assert_allclose(np.asarray(got["embeddings"][0], np.float32), layers[layer], atol=1e-5, rtol=0)
    pooled = _request(server.url, {"sentences": [sentence], "output": "default"}).json()["embeddings"][0]
    np.testing.assert_allclose(np.asarray(pooled, np.float32), reference(embedder, sentence, "mixed").mean(0),
                               atol=1e-5, rtol=0)


BAD_REQUESTS = [
    ({"sentences": [["The", 3]]}, 422, "sentences[0][1]"),
    ({"sentences": ["The cat"]}, 422, "sentences[0]"),
    ({"sentences": [["a"]], "texts": ["a"]}, 422, "exactly one"),
    ({}, 422, "exactly one"),
    ({"sentences": [["a"]], "output": "bottom"}, 422, "output"),
    ({"sentences": [["a"]], "output": "layer:9"}, 422, "layer:9"),
    ({"sentences": [["a"]], "output": "default", "pool": "max"}, 422, "mean pool"),
    ({"sentences": [["a"]], "mix": [0.0, 1.0]}, 422, "mix"),
    ({"sentences": [["a"]], "pool": "median"}, 422, "pool"),
    ({"sentences": [["a"]], "surprise": 1}, 422, "surprise"),
    ({"sentences": [["a"]] * 9}, 413, "max_request_sentences"),
    ({"texts": ["a"] * 9}, 413, "max_request_sentences"),
    ({"sentences": [["a"], ["w"] * 41]}, 413, "max_sentence_tokens"),
    ({"sentences": [["wordy" * 20] * 30] * 8}, 413, "max_body_bytes"),
]


@pytest.mark.parametrize("body,status,names", BAD_REQUESTS)
def test_each_bad_request_gets_its_code_and_a_json_error(server: ServerProcess, body: dict, status: int, names: str):
    answer = _request(server.url, body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"type", "message"} and names in error["message"], error
    assert error["type"] == {422: "invalid_request", 413: "limit_exceeded"}[status]


def test_malformed_bodies_and_unknown_routes(server: ServerProcess):
    bad_json = httpx.post(f"{server.url}/embed", content=b'{"sentences": [["a"]', timeout=10,
                          headers={"content-type": "application/json"})
    assert bad_json.status_code == 422 and bad_json.json()["error"]["type"] == "invalid_request"
    chunked = httpx.post(f"{server.url}/embed", content=iter([b'{"texts": ["' + b"a " * 6000, b'"]}'] * 2),
                         timeout=10)  # no content-length: streamed past max_body_bytes
    assert chunked.status_code == 413 and "max_body_bytes" in chunked.json()["error"]["message"]
    missing = httpx.get(f"{server.url}/nowhere")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
    wrong_method = httpx.get(f"{server.url}/embed")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"  # RFC 9110: the methods it takes


@pytest.mark.parametrize("body, headers, status, says", [
    (b"", {}, 422, "the request has no body"),
    (b'\xef\xbb\xbf{"texts": ["a"]}', {}, 422, "begins with a byte-order mark: send UTF-8 JSON without it"),
    (b"\x1f\x8b\x08\x00 gzip", {"content-encoding": "gzip"}, 415, "Content-Encoding gzip"),
])
def test_a_body_the_server_cannot_read_is_named_for_what_it_is(server: ServerProcess, body, headers, status, says):
    answer = httpx.post(f"{server.url}/embed", content=body, timeout=10,
                        headers={"content-type": "application/json", **headers})
    assert answer.status_code == status and says in answer.json()["error"]["message"], answer.text


def test_garbage_on_the_socket_does_not_kill_the_server(server: ServerProcess):
    host, port = server.url.removeprefix("http://").split(":")
    for garbage in (b"\x00\xff\x13 not http\r\n\r\n", b"POST /embed HTTP/1.1\r\nContent-Length: 50\r\n\r\n{"):
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as s:
            s.sendall(garbage)
            s.shutdown(socket.SHUT_WR)
            s.recv(1000)
    assert httpx.get(f"{server.url}/health").json() == {"status": "alive"}
    assert _request(server.url, {"texts": ["still here"]}).status_code == 200


def test_health_ready_info_and_metrics(server: ServerProcess):
    assert httpx.get(f"{server.url}/health").json() == {"status": "alive"}
    assert httpx.get(f"{server.url}/ready").status_code == 200
    info = httpx.get(f"{server.url}/info").json()
    assert (info["dim"], info["layers"], info["backend"], info["device"]) == (D, L1, "torch", "cpu")
    assert info["limits"]["max_request_sentences"] == 8 and info["limits"]["max_wait_ms"] == 20
    assert info["limits"]["max_batch_tokens"] == info["run"]["batch"]["tokens"] == 400  # the budget asked, both
    assert info["run"]["batch"]["reason"].startswith("asked: 400 tokens a batch (the run's own: batches of 16,384")
    _request(server.url, {"texts": ["one two three"]})
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("elmo_requests_total", "elmo_queue_depth", "elmo_batch_sentences", "elmo_batch_tokens",
                 "elmo_queue_wait_seconds", "elmo_model_seconds", "elmo_tokens_total"):
        assert f"# TYPE {name} " in text, name
    assert 'elmo_requests_total{route="/embed",status="200"}' in text
    assert metric(text, "elmo_tokens_total") >= 3 and metric(text, "elmo_queue_depth") == 0
    assert httpx.get(f"{server.url}/openapi.json").json()["paths"].keys() >= {"/embed", "/v1/embeddings"}


def test_head_answers_as_get_without_a_body(server: ServerProcess):
    """HEAD on a GET route (a load balancer's probe): GET's status and headers, no body; the
    connection then serves the next request (a body sent after a HEAD's answer would be read as it)."""
    for route in ("/health", "/ready", "/info", "/metrics"):
        got = httpx.get(f"{server.url}{route}")
        raw = raw_reply(server.url, f"HEAD {route} HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n"
                                    f"Connection: close\r\n\r\n".encode())
        head, _, rest = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), (route, head)
        length = len(got.content) if route != "/metrics" else ""  # the metrics move between two requests
        assert f"content-length: {length}".encode() in head.lower(), (route, head)
        assert rest.startswith(b"HTTP/1.1 200") and rest.endswith(b'{"status":"alive"}'), (route, rest[:200])


def test_openai_route_with_the_openai_client(server: ServerProcess, embedder: Embedder):
    openai = pytest.importorskip("openai", reason="the openai client (dev extra) is not installed")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    texts = ["The cat sat on the mat .", "Café naïve 日本語"]
    # No encoding_format: the client asks for base64 and decodes it itself; given one, it hands it over.
    for fmt in (None, "float", "base64"):
        answer = client.embeddings.create(input=texts, model="elmo", **({"encoding_format": fmt} if fmt else {}))
        assert [d.index for d in answer.data] == [0, 1] and answer.usage.prompt_tokens == 10
        for text, item in zip(texts, answer.data):
            want = reference(embedder, text.split(), "mixed", "mean", normalize=True)
            got = decode(item.embedding, "base64" if fmt == "base64" else "float", want.shape)
            # a server batch (other rows beside it) vs the sentence alone: fp32 sums in another order, a few ulp x the recurrence
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
            assert abs(float(np.linalg.norm(got.astype(np.float64))) - 1.0) < 1e-6  # unit length, as OpenAI's
    raw = httpx.post(f"{server.url}/v1/embeddings", json={"input": texts[0], "normalize": False}).json()
    # a server batch (other rows beside it) vs the sentence alone: fp32 sums in another order, a few ulp x the recurrence
    np.testing.assert_allclose(raw["data"][0]["embedding"], reference(embedder, texts[0].split(), "mixed", "mean"),
                               atol=1e-5, rtol=0)
    unit = httpx.post(f"{server.url}/embed", json={"texts": texts, "normalize": True}).json()["embeddings"][0]
    # unit vectors rounded to fp32: |norm - 1| <~ sqrt(D) ulp
    np.testing.assert_allclose(np.linalg.norm(np.asarray(unit, np.float64), axis=1), 1.0, atol=1e-6, rtol=0)
    one = httpx.post(f"{server.url}/v1/embeddings", json={"input": "Hi"}).json()
    assert one["object"] == "list" and one["data"][0]["object"] == "embedding" and len(one["data"][0]["embedding"]) == D
    for body, names in (({"input": ["a", ""]}, "input[1]"), ({"input": "a", "dimensions": 7}, "dimensions"),
                        ({"input": [1, 2]}, "input")):
        bad = httpx.post(f"{server.url}/v1/embeddings", json=body)
        assert bad.status_code == 422 and names in bad.json()["error"]["message"], bad.text


def test_an_answer_is_built_off_the_event_loop():
    """An answer of millions of numbers takes its encoder about a second: built on the loop, it held
    every other connection (``/health`` too) that long. ``answered`` builds it on a thread."""
    import asyncio
    import json
    import threading

    from serving.app import answered

    async def main() -> tuple[threading.Thread, threading.Thread, bytes]:
        seen = []
        response = await answered(lambda: seen.append(threading.current_thread()) or {"v": np.arange(3)})
        return threading.current_thread(), seen[0], response.body

    loop_thread, built_on, body = asyncio.run(main())
    assert built_on is not loop_thread and json.loads(body) == {"v": [0, 1, 2]}


def test_an_answer_is_encoded_in_pieces_that_let_the_event_loop_run(monkeypatch):
    """orjson holds the GIL through one call: an answer of millions of numbers in one call stalled the
    loop as long on a thread as on the loop. The pieces: the same bytes, none over CHUNK_NUMBERS."""
    import orjson

    import serving.middleware as middleware

    rng = np.random.default_rng(0)
    body = {"embeddings": [rng.standard_normal((3, 200, 256), dtype=np.float32), "c2FtcGxl", None,
                           rng.standard_normal((5, 16), dtype=np.float32)], "dim": 256, "usage": {"tokens": 205}}
    calls, real = [], orjson.dumps

    def dumps(value, option=None):  # orjson's own, each call's numbers counted
        calls.append(value.size if isinstance(value, np.ndarray) else 0)
        return real(value, option=option) if option is not None else real(value)

    monkeypatch.setattr(middleware.orjson, "dumps", dumps)
    got = middleware.json_in_pieces(body)
    monkeypatch.undo()
    assert got == orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    assert max(calls) <= middleware.CHUNK_NUMBERS < 3 * 200 * 256
