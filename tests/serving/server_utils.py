"""A real ``elmo serve`` process on 127.0.0.1 (port 0), started the way a user starts it, and the
reference answers its vectors must equal."""
from __future__ import annotations

import base64
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from inference import Embedder

ROOT = Path(__file__).resolve().parents[2]


class ServerProcess:
    """``elmo serve --model MODEL --port 0 ARGS``; ``url`` once it printed ``listening on``."""

    def __init__(self, model: Path, *args: str, timeout: float = 60) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "elmo_cli", "serve", "--model", str(model), "--port", "0", *args],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True).start()
        self.url = self._wait_listening(timeout)

    @staticmethod
    def _pump(stream, put) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            put(line.rstrip("\n"))

    def _wait_listening(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith("listening on "):
                return line.removeprefix("listening on ")
        self.stop()
        raise AssertionError(f"elmo serve did not get ready (exit {self.proc.poll()}):\n" + "\n".join(self.stderr))

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample in Prometheus text (e.g. ``elmo_cancelled_sentences_total``)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the metrics:\n{text}")


def decode(value, encoding: str, shape: tuple[int, ...]) -> np.ndarray | None:  # type: ignore[no-untyped-def]
    if value is None:
        return None
    if encoding == "base64":
        return np.frombuffer(base64.b64decode(value), dtype="<f4").reshape(shape)
    return np.asarray(value, dtype=np.float32).reshape(shape)


def reference(embedder: Embedder, tokens: list[str], output: str = "mixed", pool: str | None = None,
              mix: list[float] | None = None, gamma: float = 1.0, normalize: bool = False) -> np.ndarray | None:
    """``embed_sentences`` on this sentence alone: what the server must answer for it."""
    return embedder.embed_sentences([tokens], output=output, pool=pool, mix_weights=mix, gamma=gamma,
                                    normalize=normalize)[0]
