"""The pipeline's errors (``elmo_core.errors`` below them): an OUTPUT_DIR that cannot be claimed, a
shard published by another writer, vectors that are not finite, a worker lost."""
from __future__ import annotations

from elmo_core.errors import ElmoError, SettingError
from inference.errors import NonFiniteError

__all__ = ["NonFiniteError", "OtherJobError", "OutputDirError", "ShardPublishedError", "WorkerLostError"]


class OutputDirError(ElmoError):
    """OUTPUT_DIR is not empty, holds another job's output, or holds files this job did not write."""


class OtherJobError(OutputDirError, SettingError):
    """OUTPUT_DIR holds the output of a job with other settings: each named by its field in
    backquotes (`dtype`), so that a door names it as its users spell it (the CLI: ``--dtype``)."""


class ShardPublishedError(OutputDirError):
    """Another writer published the shard first (a retried or speculative task of the same job, or
    the earlier attempt of a killed one); ``sink.ShardWriter.commit`` adopts what it published."""


class WorkerLostError(ElmoError):
    """A worker of the job died (killed, out of memory, its node gone): its shard was not committed."""
