"""Connections that cannot hold the server: deadlines for a request's headers and body, a cap on
open connections, bounded keep-alive, an answer for a client that half-closes after its request,
and a SIGTERM that cuts stalled uploads at once.

uvicorn's HTTP/1.1 protocol leaves open for ever a connection that stays silent or sends half its
headers or body (enough of them exhaust the file descriptors). ``GuardedH11Protocol`` is its h11
protocol with deadlines, run instead of httptools (the parse is a small part of a request:
``bench/bench_serve.py``). A deadline that passes answers 408 (or closes a connection that sent
nothing), counted in ``elmo_connections_cut_total{phase}``; a connection over the cap is closed as
it is accepted (``elmo_connections_refused_total``).
"""
from __future__ import annotations

import asyncio
import socket
from http import HTTPStatus
from typing import Any

import h11
import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import ConnectionLimits
from .metrics import ServeMetrics
from .middleware import CUT_STATUS


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines. Phases: ``headers`` (waiting for a request's
    headers, under ``header_timeout_s``), ``body`` (its body, under ``body_timeout_s``), ``app``
    (the request is whole: the app answers it; no deadline)."""

    def __init__(self, config: Any, server_state: Any, app_state: dict, _loop: Any = None, *,
                 limits: ConnectionLimits, cap: int, metrics: ServeMetrics) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits, self.cap, self.metrics = limits, cap, metrics
        self._timer: asyncio.TimerHandle | None = None
        self._phase, self._half_closed = "headers", False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.cap:
            self.metrics.connections_refused.inc()
            transport.abort()  # frees the descriptor now; connection_lost follows
            return
        self.metrics.open_connections.set(len(self.connections))
        self._wait("headers", self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)
        self.metrics.open_connections.set(len(self.connections))

    def eof_received(self) -> bool | None:
        """The client's end of a whole request: it half-closed (and waits for the answer) or went
        away. A ``100 Continue`` (which HTTP/1.1 clients must accept before any answer) tells them
        apart: a closed socket answers it with a reset, which ``_check_peer`` sees and turns into
        the disconnect that drops the request's queued work."""
        self._half_closed = True
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle.more_body:
            return None  # nothing whole to answer: the transport closes
        if not cycle.response_started:
            self.transport.write(self.conn.send(h11.InformationalResponse(status_code=100, headers=[],
                                                                            reason=b"Continue")))
        self.loop.call_later(0.02, self._check_peer, 0.02)
        return True

    def _check_peer(self, delay: float) -> None:
        if self.transport.is_closing() or self.cycle is None or self.cycle.response_complete:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):  # reset: the client is gone
            self.transport.abort()  # connection_lost marks the request disconnected
            return
        self.loop.call_later(min(2 * delay, 1.0), self._check_peer, min(2 * delay, 1.0))

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return  # still waiting for a request: the header deadline runs
        if cycle.more_body:
            if self._phase != "body":
                self._wait("body", self.limits.body_timeout_s)
        elif self._phase != "app":
            self._stop_timer()
            self._phase = "app"

    def on_response_complete(self) -> None:
        if self._half_closed:
            self.server_state.total_requests += 1
            self.transport.close()
            return
        self._wait("headers", self.limits.header_timeout_s)  # the next request's (pipelined: replaced at once)
        super().on_response_complete()

    def shutdown(self) -> None:
        """SIGTERM: a request whose body has not all arrived is refused now; whole ones finish."""
        if self._phase == "body":
            self._cut("shutdown", 503, "not_ready",
                      "the server is shutting down and the request's body had not all arrived: retry elsewhere")
        super().shutdown()

    def _wait(self, phase: str, seconds: float) -> None:
        self._stop_timer()
        self._phase = phase
        self._timer = self.loop.call_later(seconds, self._expired)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._phase == "body":
            self._cut("body", 408, "request_timeout",
                      f"the request's body did not arrive within {self.limits.body_timeout_s:g} s (--body-timeout-s)")
        elif self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
            self._cut("idle", None, "", "")  # no byte of a request: just close
        else:
            self._cut("headers", 408, "request_timeout", f"the request's headers did not arrive within "
                      f"{self.limits.header_timeout_s:g} s (--header-timeout-s)")

    def _cut(self, phase: str, status: int | None, kind: str, message: str) -> None:
        """Answer ``status`` (if the app has not begun to; a whole HTTP/1.1 response written below the
        app) and close; the app sees a disconnect."""
        self._stop_timer()
        self.metrics.connections_cut.labels(phase).inc()
        cycle = self.cycle
        started = cycle is not None and not cycle.response_complete and cycle.response_started
        if status is not None and not started:
            body = orjson.dumps({"error": {"type": kind, "message": message}})
            self.transport.write(f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                                 f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode("ascii") + body)
            if cycle is not None:
                cycle.scope[CUT_STATUS] = status  # what AccessLog logs and counts (the app saw a disconnect)
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()
