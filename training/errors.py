"""Typed errors of the training package (subclasses of elmo_core's, so the CLI maps them)."""
from elmo_core.errors import ElmoError, InputError


class CorpusError(InputError):
    """A training or evaluation corpus that is missing, unreadable, empty or of the wrong schema."""


class CheckpointError(ElmoError):
    """A checkpoint or run directory that cannot be resumed from."""


class TrainingError(ElmoError):
    """Training cannot go on (e.g. the loss became NaN)."""
