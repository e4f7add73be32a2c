from __future__ import annotations

import pytest

from .server_utils import ServerProcess


@pytest.fixture
def serve():
    """``serve(model, *args)`` starts a ``ServerProcess`` that is stopped, with its whole process
    group, when the test ends, passed or failed."""
    started: list[ServerProcess] = []

    def start(model, *args, **kw) -> ServerProcess:  # type: ignore[no-untyped-def]
        server = ServerProcess(model, *args, **kw)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
