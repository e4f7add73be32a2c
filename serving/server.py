"""Run the app on one machine with uvicorn: bind first (port 0: any free one), load the model while
/health answers, print ``listening on URL`` once ready. SIGTERM or SIGINT stop accepting
connections, cut uploads under way (503), run the queued sentences at once (``ServingState.drain``),
let the requests in flight finish for up to ``shutdown_timeout_s``, close the model and return; a
model that fails to load stops the server, and ``run_server`` raises its error.

Connections cannot hold the server (``GuardedH11Protocol``, run instead of httptools: the parse is
a small part of a request, ``bench/bench_serve.py``): uvicorn's h11 protocol leaves open for ever a
connection that stays silent or sends half its headers or body, so deadlines for both (a 408, or a
close where nothing was sent: ``elmo_connections_cut_total{phase}``), a cap on open connections
(closed as accepted: ``elmo_connections_refused_total``), bounded keep-alive, an answer for a client
that half-closes after its request (each whole request it sent, pipelined ones too). An answer a
client does not read is cut after ``send_timeout_s`` without progress (phase ``send``), so neither
its connection nor its buffered bytes are held for ever. An answer given before the request's body
has all arrived (413, 503) is followed by a lingering close: our side shut, the rest of the body
read and dropped (``LINGER_BYTES`` at most, within the body deadline), so a client that reads its
answer only once it has sent its body gets it instead of a reset.
"""
from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import logging
import socket
import struct
import sys
import termios
from http import HTTPStatus
from typing import Any, Callable

import h11
import orjson
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from elmo_core.errors import InputError

from .app import create_app
from .limits import AccessOptions, ConnectionLimits, check_address
from .metrics import ServeMetrics
from .middleware import CUT_STATUS, exposure_warning
from .service import ServingState

log = logging.getLogger("elmo.serving")
LINGER_BYTES = 64 << 20  # the most of a refused request's body read and dropped before the close


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (IPv4 or IPv6; port 0: a free one)."""
    check_address(host, port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:  # socket.gaierror too: a host name that does not resolve
        sock.close()
        taken = e.errno == errno.EADDRINUSE
        hint = ("another process listens there: give another --port, or --port 0 for any free one" if taken else
                "not an address of this machine: give one of its own, 127.0.0.1 (this machine only) or 0.0.0.0 (every "
                "interface)")
        raise InputError(f"cannot listen on --host {host} --port {port}: {e.strerror or e}; {hint}") from None
    sock.set_inheritable(True)
    return sock


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def configure_logging(quiet: bool) -> None:
    """The access log (one line per request) and the server's messages, on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("elmo.serving", "elmo.serving.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler] if name == "elmo.serving" else []
        logger.setLevel(logging.WARNING if quiet else logging.INFO)


def _unacknowledged(transport: asyncio.Transport) -> int:
    """Bytes in the socket's send queue the client has not acknowledged (Linux's ``SIOCOUTQ``);
    0 where the system does not say."""
    sock = transport.get_extra_info("socket")
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (AttributeError, OSError, ValueError):  # no socket, a closed one, or no such ioctl here
        return 0


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines. Phases: ``headers`` (under ``header_timeout_s``), ``body``
    (under ``body_timeout_s``), ``app`` (the request is whole: the app answers it; no deadline)."""

    def __init__(self, config: Any, server_state: Any, app_state: dict, _loop: Any = None, *,
                 limits: ConnectionLimits, cap: int, metrics: ServeMetrics) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits, self.cap, self.metrics = limits, cap, metrics
        self._timer: asyncio.TimerHandle | None = None
        self._phase, self._half_closed = "headers", False
        self._send_check: asyncio.TimerHandle | None = None
        self._taken = (0, 0.0)  # answer bytes the kernel has taken, and since when no more
        self._dropped = 0  # bytes read and dropped after a lingering close

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = _LingeringTransport(transport, self)  # what the cycles write to and close
        if len(self.connections) > self.cap:
            self.metrics.connections_refused.inc()
            transport.abort()  # frees the descriptor now; connection_lost follows
            return
        self.metrics.open_connections.set(len(self.connections))
        self._wait("headers", self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._send_check is not None:
            self._send_check.cancel()
            self._send_check = None
        super().connection_lost(exc)
        self.metrics.open_connections.set(len(self.connections))

    def eof_received(self) -> bool | None:
        """The client's end of a whole request: it half-closed (and waits) or went away. A ``100
        Continue`` (HTTP/1.1 clients accept it before any answer) tells them apart: a closed socket
        answers it with a reset, which ``_check_peer`` turns into a disconnect (its work dropped)."""
        if self.transport.lingering:
            return None  # the refused body's end: the transport closes
        self._half_closed = True
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle.more_body:
            return None  # nothing whole to answer: the transport closes
        if not cycle.response_started and self.conn.their_http_version != b"1.0":  # no 1xx to HTTP/1.0
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

    def data_received(self, data: bytes) -> None:
        if not self.transport.lingering:
            super().data_received(data)
            return
        self._dropped += len(data)  # the rest of a refused request's body
        if self._dropped > LINGER_BYTES:
            self.transport.abort()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes h11 cannot parse as a request, in the API's JSON error shape."""
        body = orjson.dumps({"error": {"type": "invalid_request", "message": f"{msg}: send a valid HTTP/1.1 request"}})
        self.transport.write(self.conn.send(h11.Response(status_code=400, reason=b"Bad Request", headers=[
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")])))
        self.transport.write(self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage()))
        self.transport.close(linger=False)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_send()

    def on_response_complete(self) -> None:
        self._watch_send()
        if self.transport.lingering:  # the refused body is being read away; then the close
            self.server_state.total_requests += 1
            return
        if self._half_closed and not self.conn.trailing_data[0]:  # nothing more asked: all answered
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

    def _watch_send(self) -> None:
        """While answer bytes wait in the transport: checked every fraction of ``send_timeout_s``;
        none taken by the client for that long cuts the connection."""
        if self._send_check is None and self.transport.get_write_buffer_size():
            self._taken = (self.transport.taken(), self.loop.time())
            self._send_check = self.loop.call_later(min(1.0, self.limits.send_timeout_s / 4), self._check_send)

    def _check_send(self) -> None:
        self._send_check = None
        if not self.transport.get_write_buffer_size():
            return
        taken, now = self.transport.taken(), self.loop.time()
        if taken > self._taken[0]:
            self._taken = (taken, now)
        elif now - self._taken[1] >= self.limits.send_timeout_s:
            self.metrics.connections_cut.labels("send").inc()
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            self.transport.abort()  # a close would wait for the bytes to go
            return
        self._send_check = self.loop.call_later(min(1.0, self.limits.send_timeout_s / 4), self._check_send)

    def linger(self) -> None:
        """After a lingering close: the rest of the body has the body deadline to arrive."""
        self._wait("linger", self.limits.body_timeout_s)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self._phase == "linger":
            self.transport.abort()
            return
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
        self.transport.close(linger=False)
        self._watch_send()


class _LingeringTransport:
    """A connection's transport as uvicorn sees it, whose ``close`` lingers while the client is
    still sending the body of the request just answered (a 413 or 503 given before it was read): our
    side is shut after the answer (``write_eof``) and the protocol reads the rest and drops it
    (``GuardedH11Protocol.data_received``) until the client's end, ``LINGER_BYTES`` or the body
    deadline. Closing at once would make the kernel answer the unread bytes with a reset, which
    often reaches the client before it reads its answer."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11Protocol) -> None:
        self._transport, self._protocol, self.lingering = transport, protocol, False
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self._transport.write(data)

    def taken(self) -> int:
        """The bytes written that the client's side took: past the transport's buffer and the
        kernel's send queue (acknowledged). The kernel frees room in its queue in large steps
        (a third of it: a second or more of a client reading steadily at 1 MB/s), so the
        transport's buffer alone showed a steady reader no progress."""
        return self.written - self._transport.get_write_buffer_size() - _unacknowledged(self._transport)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self, linger: bool = True) -> None:
        sending = self._protocol.conn.their_state is h11.SEND_BODY
        if not (linger and sending and not self.is_closing() and self._transport.can_write_eof()):
            self._transport.close()
            return
        self.lingering = True
        self._transport.write_eof()  # after the answer's bytes
        self._transport.resume_reading()
        self._protocol.linger()


class _Server(uvicorn.Server):
    """uvicorn's server, whose shutdown first drains the batcher (``ServingState.drain``)."""

    def __init__(self, config: uvicorn.Config, state: ServingState) -> None:
        super().__init__(config)
        self.state = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.state.drain()
        await super().shutdown(sockets)


def make_server(state: ServingState, host: str = "127.0.0.1", port: int = 0, quiet: bool = False,
                connections: ConnectionLimits = ConnectionLimits(), access: AccessOptions = AccessOptions(),
                ) -> tuple[uvicorn.Server, socket.socket, str]:
    """The uvicorn server of ``state``'s app, its bound socket and its URL (not started yet)."""
    sock = bind(host, port)
    protocol = functools.partial(GuardedH11Protocol, limits=connections, cap=connections.connection_cap(),
                                 metrics=state.metrics)
    config = uvicorn.Config(create_app(state, access), http=protocol, log_level="warning" if quiet else "info",
                            access_log=False, lifespan="on", timeout_keep_alive=connections.keep_alive_s,
                            timeout_graceful_shutdown=connections.shutdown_timeout_s, log_config=None)
    server = _Server(config, state)
    state.on_failure = lambda error: setattr(server, "should_exit", True)
    return server, sock, url(host, sock.getsockname()[1])


def run_server(state: ServingState, host: str = "127.0.0.1", port: int = 0, quiet: bool = False,
               announce: Callable[[str], None] | None = None, connections: ConnectionLimits = ConnectionLimits(),
               access: AccessOptions = AccessOptions()) -> None:
    """Serve until SIGTERM / SIGINT. ``announce`` gets ``listening on URL`` once the model is ready
    (default: printed on stdout)."""
    configure_logging(quiet)
    server, sock, address = make_server(state, host, port, quiet, connections, access)
    if warning := exposure_warning(host, access):  # once it listens there
        log.warning(warning)
    say = announce or (lambda line: print(line, flush=True))
    state.on_ready = lambda: say(f"listening on {address}")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if state.error is not None:
        raise state.error
