"""Typed errors of the probing package (subclasses of elmo_core's, so the CLI maps them)."""
from elmo_core.errors import InputError


class PictureUnavailable(InputError):
    """matplotlib, which draws the picture, is not installed."""
