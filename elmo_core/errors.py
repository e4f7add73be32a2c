"""Typed exceptions raised by library code; only the CLI turns them into exit codes."""
from __future__ import annotations

import re
from typing import Callable


class ElmoError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(ElmoError, ValueError):
    """An options.json (or config value) that is not a valid ELMo architecture."""


class WeightsError(ElmoError, ValueError):
    """A weight file that is missing, truncated or does not match its options."""


class InputError(ElmoError, ValueError):
    """Sentences or tokens of the wrong type or shape."""


class TokenTypeError(InputError):
    """A token that is not a ``str``."""


_SETTING = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


class SettingError(InputError):
    """A setting out of its range, or settings that cannot go together. The text names each setting
    by its field in backquotes (`gamma`, `max_tokens_per_batch`); ``str()`` shows the field names
    (the Python API's keywords, the HTTP body's keys), ``spelled`` shows them as a door spells them
    (the CLI: the flags the user typed, ``elmo_cli.vocabulary.flag_spelling``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)  # args: the marked text, so that a pickled copy (Ray, Spark) keeps the names
        self.text = text

    def __str__(self) -> str:
        return self.spelled(lambda name: name)

    @property
    def settings(self) -> tuple[str, ...]:
        """The fields the text names, in order."""
        return tuple(_SETTING.findall(self.text))

    def spelled(self, spell: Callable[[str], str]) -> str:
        """The message, each setting named as ``spell`` names its field."""
        return _SETTING.sub(lambda m: spell(m.group(1)), self.text)


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` for a message, its first ``limit`` characters where it is longer (a request
    field of a megabyte is named, not sent back)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
