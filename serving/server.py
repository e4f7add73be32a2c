"""Run the app on one machine with uvicorn (connections: ``serving.connections``): bind first (port
0: any free one), load the model while /health answers, print ``listening on URL`` once ready.

SIGTERM or SIGINT stop accepting connections, cut uploads under way (503), run the queued sentences
at once (``ServingState.drain``), let the requests in flight finish for up to ``shutdown_timeout_s``,
close the model and return; a model that fails to load stops the server, and ``run_server`` raises
its error."""
from __future__ import annotations

import functools
import logging
import socket
import sys
from typing import Callable

import uvicorn

from .app import create_app
from .connections import GuardedH11Protocol
from .limits import AccessOptions, ConnectionLimits, check_address
from .middleware import exposure_warning
from .service import ServingState

log = logging.getLogger("elmo.serving")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (IPv4 or IPv6; port 0: a free one)."""
    check_address(host, port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
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
    if warning := exposure_warning(host, access):
        log.warning(warning)
    server, sock, address = make_server(state, host, port, quiet, connections, access)
    say = announce or (lambda line: print(line, flush=True))
    state.on_ready = lambda: say(f"listening on {address}")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if state.error is not None:
        raise state.error
