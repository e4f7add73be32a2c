"""Typed exceptions raised by library code; only the CLI turns them into exit codes."""


class ElmoError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(ElmoError, ValueError):
    """An options.json (or config value) that is not a valid ELMo architecture."""


class WeightsError(ElmoError, ValueError):
    """A weight file that is missing, truncated or does not match its options."""


class InputError(ElmoError, ValueError):
    """Sentences or tokens of the wrong type or shape."""
