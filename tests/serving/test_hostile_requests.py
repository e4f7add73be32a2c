"""A real ``elmo serve`` under hostile requests (issue #47): a slow body cut at its deadline is
logged and counted as the 408 it was answered with, the ``Bearer`` scheme is case-insensitive
(RFC 7235), and a hypothesis pass over the request schema (random bodies, and valid bodies with
one field replaced by any JSON value) is answered 200 or 4xx with a JSON error, never 500."""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import TINY_OPTIONS, make_model_dir
from tests.processes import WAIT_S, wait_until

from .server_utils import ServerProcess, raw_reply

KEY = "Key-with-Case"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    model = make_model_dir(tmp_path_factory.mktemp("hostile") / "tiny", TINY_OPTIONS)
    srv = ServerProcess(model, "--api-key", KEY, "--body-timeout-s", "1", "--max-sentence-tokens", "40",
                        "--max-request-sentences", "8")
    yield srv
    srv.stop()


def _requests(url: str, status: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=WAIT_S).text
    prefix = f'elmo_requests_total{{route="/embed",status="{status}"}} '
    return next((float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


def test_a_slow_body_cut_at_its_deadline_is_logged_and_counted_as_408(server: ServerProcess):
    before = _requests(server.url, "408"), _requests(server.url, "499")
    reply = raw_reply(server.url, f"POST /embed HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                                  f"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"te".encode())
    assert reply.startswith(b"HTTP/1.1 408 "), reply
    wait_until(lambda: _requests(server.url, "408") != before[0], "the 408 counted")
    assert (_requests(server.url, "408"), _requests(server.url, "499")) == (before[0] + 1, before[1])
    wait_until(lambda: any('"POST /embed" 408 ' in line for line in server.stderr), "the 408 logged")


@pytest.mark.parametrize("header, status", [
    (f"Bearer {KEY}", 200), (f"bearer {KEY}", 200), (f"BEARER {KEY}", 200), (f"Bearer  {KEY}", 200),
    (f"Bearer {KEY.lower()}", 401), (f"Basic {KEY}", 401), (KEY, 401), ("Bearer", 401)])
def test_the_auth_scheme_is_case_insensitive_and_the_key_is_not(server: ServerProcess, header, status):
    r = httpx.post(f"{server.url}/embed", json={"texts": ["a b"]}, headers={"authorization": header}, timeout=30)
    assert r.status_code == status, r.text


JSON = st.recursive(st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=10)
VALID = {"/embed": {"texts": ["The cat sat ."], "output": "mixed", "mix": [0.1, 0.2, 0.3], "gamma": 1.0,
                    "pool": "none", "encoding": "float", "normalize": False, "truncate": False},
         "/v1/embeddings": {"input": ["The cat"], "model": "elmo", "encoding_format": "float", "dimensions": 16,
                            "normalize": True},
         "/tokenize": {"texts": ["a b"], "truncate": True}}
NUMBERS = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e39", "-1e400", "1e308", str(2**64), "0", "-0.0"])


def _body(route: str, field: str, value: object, raw_number: str | None) -> bytes:
    body = dict(VALID[route])
    if field in body or field == "extra":
        body[field] = "__RAW__" if raw_number is not None else value
    text = json.dumps(body)
    return text.replace('"__RAW__"', raw_number).encode() if raw_number is not None else text.encode()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(list(VALID)), field=st.sampled_from(sorted({k for b in VALID.values() for k in b}
                                                                         | {"sentences", "extra", "texts"})),
       value=JSON, raw=st.none() | NUMBERS, junk=st.none() | st.binary(max_size=40))
def test_fuzz_the_request_schema_is_answered_200_or_4xx_never_500(server: ServerProcess, route, field, value, raw,
                                                                  junk):
    content = junk if junk is not None else _body(route, field, value, raw)
    r = httpx.post(f"{server.url}{route}", content=content, timeout=30,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 200 or 400 <= r.status_code < 500, (content, r.status_code, r.text)
    if r.status_code != 200:
        assert r.json()["error"]["type"] in ("invalid_request", "limit_exceeded"), r.text


def test_the_server_is_still_healthy_after_the_fuzz(server: ServerProcess):
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    assert not any("Traceback" in line for line in server.stderr), "\n".join(server.stderr[-20:])
