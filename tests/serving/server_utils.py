"""A real ``elmo serve`` process on 127.0.0.1 (port 0), started the way a user starts it, and the
reference answers its vectors must equal."""
from __future__ import annotations

import base64
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from inference import Embedder
from tests.processes import WAIT_S, start_process, stop_process

ROOT = Path(__file__).resolve().parents[2]


class ServerProcess:
    """``elmo serve --model MODEL --port 0 ARGS`` in a process group of its own; ``url`` once it
    printed ``listening on``. ``stop()`` ends the group, with whatever the server started; the
    ``serve`` fixture (tests/serving/conftest.py) calls it when the test ends, passed or failed."""

    def __init__(self, model: Path, *args: str, timeout: float = WAIT_S) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "elmo_cli", "serve", "--model", str(model), "--port", "0", *args]
        self.proc = start_process(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True).start()
        try:
            self.url = self._wait_listening(timeout)
        except BaseException:
            self.stop()
            raise

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

    def wait(self, timeout: float = WAIT_S) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to whatever of its process group is left after 30 s."""
        stop_process(self.proc)


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


def raw_reply(url: str, data: bytes) -> bytes:
    """``data`` sent on a new connection to the server at ``url``, then every byte it answers until
    it closes the connection (a reset ends the answer too)."""
    host, port = url.removeprefix("http://").split(":")
    reply = b""
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as s:
        s.sendall(data)
        try:
            while chunk := s.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass
    return reply
