"""Who may call the server: an API key (``Authorization: Bearer KEY``, as OpenAI clients send it),
the browser origins allowed by CORS, and a warning for a server reachable beyond this machine
with no key."""
from __future__ import annotations

import hmac
import ipaddress

from .limits import AccessOptions
from .middleware import ASGIApp, Receive, Scope, Send, send_error


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, access: AccessOptions) -> str | None:
    """The warning for a server bound beyond loopback with no API key, else None."""
    if access.api_key or is_loopback(host):
        return None
    return (f"listening on {host} with no API key: anyone who can reach this port can use the model; "
            f"set --api-key (or ELMO_API_KEY), or bind 127.0.0.1 behind a proxy")


class ApiKey:
    """401 (``WWW-Authenticate: Bearer``) for a request without ``Authorization: Bearer KEY``."""

    def __init__(self, app: ASGIApp, key: str, open_paths: frozenset[str], docs_prefix: str) -> None:
        self.app, self.open_paths, self.docs_prefix = app, open_paths, docs_prefix
        self.expected = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or scope["path"].startswith(self.docs_prefix):
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.strip().partition(b" ")
        # RFC 7235: the scheme is case-insensitive ("bearer KEY" is "Bearer KEY"); the key is compared exactly
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.lstrip(b" "), self.expected):
            return await self.app(scope, receive, send)
        what = "a wrong API key" if given else "no API key"
        await send_error(send, 401, "unauthorized", f"{what}: send the header Authorization: Bearer KEY "
                         f"(the key the server was started with)", {"www-authenticate": "Bearer"})
