"""The server's options, frozen dataclasses validated once (``elmo serve`` generates its flags from
their fields): ``ServeLimits`` (a request, a batch, the queue), ``ConnectionLimits`` (how long a
client may take, how many may connect) and ``AccessOptions`` (who may call). Standard library only,
so the CLI imports it without the ``serve`` extra."""
from __future__ import annotations

import resource
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING

from elmo_core.bounds import check_count, check_flags, check_gpus, check_number, setting
from elmo_core.errors import SettingError
from inference.batching import BatchPolicy, cpu_batch_budget

if TYPE_CHECKING:
    from inference.model_run import ModelRun


# A model batch's padded tokens by default: the run's (``ModelRun.batch``). A CPU's (4,096 at full
# size, up to 16,384 for narrower models) run ~100-400 ms (requests arriving meanwhile batch anyway);
# a GPU's batch costs about the same from a few sentences to ~1,000 (docs/gpu.md), so whatever waits
# in the queue joins the next batch.
DEFAULT_BATCH = "the run's: on a CPU 4096 to 16384 by the model's width, sized to the GPU's memory on CUDA"


@dataclass(frozen=True)
class ServeLimits:
    """What one request, one model batch and the queue may hold (each field's help says how)."""

    max_batch_tokens: int | None = setting(None, f"padded tokens (sentences x longest) per model batch (default: "
                                                  f"{DEFAULT_BATCH})", meaning="max_batch_tokens")
    max_wait_ms: float = setting(0.0, None, meaning="max_wait_ms")
    max_queue: int = setting(1024, "sentences waiting for the model; a request that does not fit gets 503 + "
                                   "Retry-After")
    max_request_sentences: int = setting(256, "sentences (or texts, or inputs) one request may hold (else 413)")
    max_sentence_tokens: int = setting(256, "tokens one sentence may hold (else 413, or cut with --auto-truncate)",
                                       meaning="max_sentence_tokens")
    max_body_bytes: int = setting(4 * 1024 * 1024, "bytes of one request body (else 413)")
    max_answer_values: int = setting(1 << 24, "numbers one answer may hold, vectors x their width (else 413): "
                                              "64 MiB in float32, ~200 MB as JSON; bounds what one request costs "
                                              "the server's memory")
    auto_truncate: bool = setting(False, "cut a sentence over --max-sentence-tokens to that length instead of a 413 "
                                         "(a request's \"truncate\" overrides it)")

    def __post_init__(self) -> None:
        check_flags(self)
        check_count("max_batch_tokens", self.max_batch_tokens, optional=DEFAULT_BATCH)
        check_number("max_wait_ms", self.max_wait_ms, 0, 60_000, unit=" ms")
        for name in ("max_queue", "max_request_sentences", "max_sentence_tokens", "max_body_bytes", "max_answer_values"):
            check_count(name, getattr(self, name))
        if self.max_sentence_tokens > self.batch_tokens:
            raise SettingError(f"`max_sentence_tokens` ({self.max_sentence_tokens}) must be at most "
                               f"`max_batch_tokens` ({self.batch_tokens}) so one sentence fits a batch")
        if self.max_request_sentences > self.max_queue:
            raise SettingError(f"`max_request_sentences` ({self.max_request_sentences}) must be at most "
                               f"`max_queue` ({self.max_queue}) so one request fits the queue")

    def on_run(self, run: ModelRun) -> "ServeLimits":
        """These limits with the run's batch budget filled in where none was asked."""
        return self if self.max_batch_tokens is not None else replace(self, max_batch_tokens=run.batch.tokens)

    @property
    def batch_tokens(self) -> int:
        """``max_batch_tokens``, a CPU's where no run filled it in."""
        return self.max_batch_tokens if self.max_batch_tokens is not None else cpu_batch_budget().tokens

    @property
    def batch_policy(self) -> BatchPolicy:
        """The engine's batching terms (no sentence exceeds max_sentence_tokens here: none is cut)."""
        return BatchPolicy(max_sentence_length=self.max_sentence_tokens, max_tokens_per_batch=self.batch_tokens)

    def as_dict(self) -> dict:
        return {**asdict(self), "max_batch_tokens": self.batch_tokens}


FD_RESERVE = 64  # descriptors kept for the model's files, logs and the process itself
MAX_CONNECTIONS_CAP = 4096


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take, and how many may be connected (``elmo serve``'s flags)."""

    header_timeout_s: float = setting(10.0, "seconds a request's headers may take to arrive, from the connection's "
                                            "start or the previous answer (else 408 and close)")
    body_timeout_s: float = setting(30.0, "seconds a request's body may take to arrive after its headers (else 408)")
    keep_alive_s: float = setting(5.0, "seconds an idle connection is kept open between requests")
    send_timeout_s: float = setting(30.0, "seconds an answer may wait for its client to take a byte of it "
                                          "(else the connection is cut)")
    max_connections: int = setting(0, "open connections; more are closed as they are accepted "
                                       "(0: the open-file limit less 64, at most 4096)")
    shutdown_timeout_s: float = setting(60.0, "on SIGTERM, seconds the requests in flight may still take")

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "max_connections":
                check_count(f.name, self.max_connections, 0, zero="the open-file limit less 64, at most 4096")
            else:
                check_number(f.name, getattr(self, f.name), 0, 3600, low_open=True, unit=" seconds")

    def connection_cap(self) -> int:
        if self.max_connections:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = MAX_CONNECTIONS_CAP if soft == resource.RLIM_INFINITY else soft - FD_RESERVE
        return max(1, min(MAX_CONNECTIONS_CAP, limit))


def check_address(host: str, port: int) -> None:
    """Where to listen: a host (an empty one would bind every interface unasked) and a TCP port, 0
    (any free one) to 65535; SettingError otherwise."""
    if not isinstance(host, str) or not host.strip():
        raise SettingError(f"`host` is empty ({host!r}): give the address to listen on, 127.0.0.1 for this machine "
                           f"only or 0.0.0.0 for every interface")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise SettingError(f"`port` must be 0 (any free port) to 65535, got {port!r}")


def check_replicas(replicas: int, num_gpus_per_replica: float) -> None:
    """Ray Serve's copies of the model and the GPUs each is given (``elmo embed``'s replicas are
    checked by the same rules, ``EmbedOptions``)."""
    check_count("replicas", replicas)
    check_gpus("num_gpus_per_replica", num_gpus_per_replica)


PROBES = frozenset({"/health", "/ready", "/metrics"})
DOCS = frozenset({"/docs", "/openapi.json"})


@dataclass(frozen=True)
class AccessOptions:
    """``api_key`` (never printed: not in repr) guards every route but the API document and, unless
    ``protect_probes``, the probes (/health, /ready, /metrics) that orchestrators call keyless."""

    api_key: str | None = field(default=None, repr=False)
    protect_probes: bool = False
    cors_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_flags(self)
        key = self.api_key  # never printed, not even in these messages
        if key is not None and not key.strip():
            raise SettingError("`api_key` is empty (is the variable in `api_key` \"$KEY\" unset?): give the key; to "
                               "serve without authentication on purpose, leave `api_key` out (and ELMO_API_KEY unset)")
        if key is not None and key != key.strip():
            raise SettingError("`api_key` begins or ends with spaces, which a client's Authorization header cannot "
                               "carry: give the key without them")

    def open_paths(self) -> frozenset[str]:
        return DOCS if self.protect_probes else DOCS | PROBES
