"""SIGINT and SIGTERM for the length of a command: raised as ``KeyboardInterrupt`` and ``Terminated``
where the main thread runs the command's own code, held while it imports or runs a finalizer.

A signal raised inside an import lands wherever the imported module happens to be: in a Python
callback of a C++ extension (torch's and onnx's pybind11 registrations) it cannot unwind and the
process aborts (``terminate called after throwing ... KeyboardInterrupt``, exit -6); in numpy it can
leave a half-initialised module behind that fails later with an unrelated traceback. Commands import
lazily (torch when the model loads, onnx when an export is needed), so an import can be under way at
any moment of a command's first seconds. In a weak reference's callback or a ``__del__`` the exception
is printed and dropped, and the command runs on. Held, the signal is sent again to the main thread as
soon as no import or finalizer is on its stack (milliseconds to a second later), and raised there.
Finalizers are known by ``weakref``'s own frames (``WeakValueDictionary``, ``finalize``) and by
``__del__``: a bare ``weakref.ref`` callback elsewhere cannot be told from ordinary code.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from types import FrameType
from typing import Iterator

REDELIVER_POLL_S = 0.005
_IMPORT_MACHINERY = ("<frozen importlib._bootstrap", "<frozen importlib._bootstrap_external")
_FINALIZER_FILES = ("weakref.py", "_weakrefset.py")  # weak references' callbacks (WeakValueDictionary's)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where SIGINT would raise KeyboardInterrupt, so the same cleanup runs."""


def unsafe(frame: FrameType | None, outer: frozenset[FrameType] = frozenset()) -> bool:
    """Whether ``frame`` or a caller of it imports a module (Python's import machinery) or runs a weak
    reference's callback or a ``__del__`` (where Python prints a raised exception, "Exception ignored
    in", and goes on: an interruption raised there is lost). The walk stops at a frame in ``outer``
    (the frames the command was called from: a command run from a module's import is not held for
    the length of that import)."""
    for f in _stack(frame):
        if f in outer:
            return False
        code = f.f_code
        if code.co_filename.startswith(_IMPORT_MACHINERY) or code.co_filename.endswith(_FINALIZER_FILES) \
                or code.co_name == "__del__":
            return True
    return False


class _Gate:
    """The handler of both signals: raise now, or hold until the main thread's imports are done."""

    def __init__(self) -> None:
        self._main = threading.main_thread().ident
        self._waiting: set[int] = set()  # the signals a redelivery thread is holding
        self._lock = threading.Lock()
        self.closed = False  # the command is over: a signal still held is dropped
        self._outer = frozenset(_stack(sys._getframe(1)))  # held: no frame made later can be taken for one

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if unsafe(frame, self._outer):
            self._hold(signum)
            return
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    def _hold(self, signum: int) -> None:
        with self._lock:
            if signum in self._waiting:  # a second Ctrl-C during the same import: one is enough
                return
            self._waiting.add(signum)
        threading.Thread(target=self._redeliver, args=(signum,), name=f"elmo-signal-{signum}",
                         daemon=True).start()

    def close(self) -> None:
        """The command is over: a signal still held is dropped, not sent to what runs next."""
        with self._lock:
            self.closed = True

    def _redeliver(self, signum: int) -> None:
        while unsafe(sys._current_frames().get(self._main), self._outer):
            time.sleep(REDELIVER_POLL_S)
        with self._lock:
            self._waiting.discard(signum)
            if not self.closed:
                signal.pthread_kill(self._main, signum)  # an import begun meanwhile is held again


def _stack(frame: FrameType | None) -> Iterator[FrameType]:
    while frame is not None:
        yield frame
        frame = frame.f_back


@contextlib.contextmanager
def command_signals() -> Iterator[None]:
    """SIGINT and SIGTERM through the gate while the block runs; the previous handlers after it.
    Outside the main thread (signal handlers belong to it) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    gate = _Gate()
    previous = {s: signal.signal(s, gate) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        gate.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
