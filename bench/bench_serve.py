"""elmo serve: throughput and latency over real HTTP against ``Embedder.embed_sentences`` on the
same sentences, in the same run, taking turns.

Full-size published architecture (random weights in the published layout, bench_bilm's), real
sotu sentences of 3-40 tokens. A real ``elmo serve`` process on 127.0.0.1; the clients are
threads of this process (httpx, float JSON, the default mixed output), each sending requests of
1-8 sentences back to back.

- throughput: ``--clients`` (32) concurrent clients over ``--requests`` requests, against
  embed_sentences (batch 64, length-sorted) over the same sentences; target >= 0.8x;
- latency: p50 / p99 per request at half that many clients;
- added latency: one unloaded single-sentence request against embed_sentences on that sentence
  alone (medians); target <= 5 ms;
- overload (``--overload-s``, 0 to skip): a second server with ``--max-queue 64`` and 64 clients
  sending back to back: p50 / p99 of the 503s and of the 200s; then the same with 200 stalled
  connections held open (half-sent headers, re-opened as the server cuts them).

  python bench/bench_serve.py [--clients 32] [--requests 128] [--repeats 3] [--device cpu] [--encoding float] \
      [--overload-s 20]
"""
from __future__ import annotations

import argparse
import random
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_bilm import full_size_model  # noqa: E402

from corpora.sotu import sotu_sentences  # noqa: E402
from inference import Embedder  # noqa: E402


def requests_of(n: int, seed: int) -> list[list[list[str]]]:
    """n requests of 1-8 real sentences (3-40 tokens), newest speeches first."""
    pool = [s for _, s in zip(range(4000), (s for _, s in sotu_sentences(newest_first=True, min_tokens=3,
                                                                          max_tokens=40)))]
    rng = random.Random(seed)
    return [rng.sample(pool, rng.randint(1, 8)) for _ in range(n)]


def start_server(model: Path, device: str, threads: int | None, extra: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "elmo_cli", "serve", "--model", str(model), "--port", "0", "--quiet", "--device", device]
    cmd += ["--threads", str(threads)] if threads else []
    cmd += extra
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("listening on "):
            return proc, line.split()[-1]
    raise RuntimeError(f"elmo serve exited {proc.wait()} before listening")


def serve_pass(url: str, reqs: list[list[list[str]]], clients: int, encoding: str = "float") -> tuple[float, list[float]]:
    """Tokens/s over all requests with ``clients`` concurrent clients, and each request's latency."""
    latencies: list[float] = []

    def one(client: httpx.Client, sentences: list[list[str]]) -> None:
        t0 = time.perf_counter()
        r = client.post(f"{url}/embed", json={"sentences": sentences, "encoding": encoding}, timeout=600)
        r.raise_for_status()
        latencies.append(time.perf_counter() - t0)

    with httpx.Client(limits=httpx.Limits(max_connections=clients)) as client, ThreadPoolExecutor(clients) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda s: one(client, s), reqs))
        elapsed = time.perf_counter() - t0
    return sum(len(t) for r in reqs for t in r) / elapsed, latencies


def direct_pass(embedder: Embedder, reqs: list[list[list[str]]]) -> float:
    sentences = [s for r in reqs for s in r]
    t0 = time.perf_counter()
    embedder.embed_sentences(sentences, output="mixed")
    return sum(map(len, sentences)) / (time.perf_counter() - t0)


def added_latency(url: str, embedder: Embedder, sentence: list[str], n: int = 20) -> tuple[float, float]:
    """Medians (s) of one request with one sentence on an idle server, and of embed_sentences on it."""
    served, direct = [], []
    with httpx.Client() as client:
        for _ in range(n):  # taking turns
            t0 = time.perf_counter()
            client.post(f"{url}/embed", json={"sentences": [sentence]}).raise_for_status()
            served.append(time.perf_counter() - t0)
            time.sleep(0.1)  # the other process's OpenMP threads stop spinning
            t0 = time.perf_counter()
            embedder.embed_sentences([sentence], output="mixed")
            direct.append(time.perf_counter() - t0)
            time.sleep(0.1)
    return statistics.median(served), statistics.median(direct)


def overload_pass(url: str, reqs: list[list[list[str]]], clients: int, seconds: float) -> dict[int, list[float]]:
    """Latencies (s) by status code of ``clients`` clients sending requests back to back for ``seconds``."""
    by_status: dict[int, list[float]] = defaultdict(list)
    stop = time.monotonic() + seconds

    def client_loop(i: int) -> None:
        with httpx.Client(timeout=120) as client:
            k = i
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                r = client.post(f"{url}/embed", json={"sentences": reqs[k % len(reqs)]})
                by_status[r.status_code].append(time.perf_counter() - t0)
                k += clients

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client_loop, range(clients)))
    return by_status


class Stalls:
    """``n`` connections that send half a request's headers and nothing more, re-opened as the
    server cuts them (a slowloris client), on a thread until ``close()``."""

    def __init__(self, url: str, n: int) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.addr, self.n, self.reopened = (host, int(port)), n, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)
        self._thread.start()

    def _open(self, sel: selectors.BaseSelector) -> None:
        s = socket.create_connection(self.addr, timeout=5)
        s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)

    def _hold(self) -> None:
        sel = selectors.DefaultSelector()
        for _ in range(self.n):
            self._open(sel)
        while not self._stop.is_set():
            for key, _ in sel.select(timeout=0.2):
                sel.unregister(key.fileobj)
                key.fileobj.close()  # cut (408 or reset): open another
                self._open(sel)
                self.reopened += 1
        for key in list(sel.get_map().values()):
            key.fileobj.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def report_overload(label: str, by_status: dict[int, list[float]]) -> None:
    parts = []
    for status in sorted(by_status):
        p50, p99 = np.percentile(by_status[status], [50, 99]) * 1000
        parts.append(f"{len(by_status[status])} x {status}: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    print(f"overload, {label}: " + "; ".join(parts), flush=True)


def overload(model: Path, a: argparse.Namespace, reqs: list[list[list[str]]]) -> None:
    proc, url = start_server(model, a.device, a.threads, ["--max-queue", "64", "--max-request-sentences", "8"])
    try:
        overload_pass(url, reqs, 64, 2.0)  # warm-up
        report_overload("64 clients, --max-queue 64", overload_pass(url, reqs, 64, a.overload_s))
        stalls = Stalls(url, 200)
        try:
            time.sleep(1.0)
            report_overload("the same with 200 stalled connections", overload_pass(url, reqs, 64, a.overload_s))
        finally:
            stalls.close()
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, help="the model's threads, in the server and here (default: all)")
    ap.add_argument("--encoding", choices=("float", "base64"), default="float", help="of the answers")
    ap.add_argument("--server-args", default="", help="more `elmo serve` options, e.g. '--max-batch-tokens 8192'")
    ap.add_argument("--workdir", type=Path, default=ROOT / ".cache" / "bench")
    ap.add_argument("--overload-s", type=float, default=20.0, help="seconds of each overload pass (0: skip)")
    ap.add_argument("--model", type=Path, help="this model directory instead of the full-size one")
    a = ap.parse_args()
    model = a.model or full_size_model(a.workdir)
    reqs = requests_of(a.requests, seed=0)
    n_sent, n_tok = sum(map(len, reqs)), sum(len(t) for r in reqs for t in r)
    print(f"{'biLM ' + str(a.model) if a.model else 'full-size biLM'} on {a.device}; {a.requests} requests of 1-8 sotu sentences "
          f"({n_sent} sentences, {n_tok} tokens); {a.clients} clients", flush=True)
    embedder = Embedder.open(model, threads=a.threads, device=a.device)
    embedder.embed_sentences(reqs[0])  # warm-up
    proc, url = start_server(model, a.device, a.threads, a.server_args.split())
    try:
        serve_pass(url, reqs[:a.clients], a.clients)  # warm-up
        served, direct = [], []
        for turn in range(a.repeats):
            direct.append(direct_pass(embedder, reqs))
            served.append(serve_pass(url, reqs, a.clients, a.encoding)[0])
            print(f"turn {turn + 1}: embed_sentences {direct[-1]:7.0f} tokens/s   elmo serve {served[-1]:7.0f} "
                  f"tokens/s   ratio {served[-1] / direct[-1]:.2f}", flush=True)
        ratio = statistics.mean(served) / statistics.mean(direct)
        print(f"throughput: elmo serve {statistics.mean(served):.0f} vs embed_sentences "
              f"{statistics.mean(direct):.0f} tokens/s = {ratio:.2f}x (target >= 0.8x)")
        rate, lat = serve_pass(url, reqs, max(1, a.clients // 2), a.encoding)
        p50, p99 = np.percentile(lat, [50, 99]) * 1000
        print(f"latency at {max(1, a.clients // 2)} clients ({rate:.0f} tokens/s): p50 {p50:.0f} ms, p99 {p99:.0f} ms")
        sentence = reqs[0][0]
        served_s, direct_s = added_latency(url, embedder, sentence)
        print(f"one {len(sentence)}-token sentence, idle server: {served_s * 1000:.1f} ms vs embed_sentences "
              f"{direct_s * 1000:.1f} ms = {1000 * (served_s - direct_s):+.1f} ms added (target <= 5 ms)")
    finally:
        proc.terminate()
        proc.wait(60)
    if a.overload_s > 0:
        overload(model, a, reqs)


if __name__ == "__main__":
    main()
