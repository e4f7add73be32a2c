"""The ranges a user's numbers are checked against, once, where the record that holds them is made
(``EmbedOptions``, ``TrainOptions``, ``ServeLimits``, ``VectorRequest``, ``ExportSpec``, ...).

Each check raises ``SettingError`` naming the setting by its field, so that every door names it as
its users type it (the CLI: the flag). A setting whose 0 or absence means something (none, the
default) says so in its message; no bad value falls back to a default.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import field, fields
from typing import Any

import numpy as np

from .errors import SettingError

MAX_COUNT = 2**31 - 1  # rows, tokens, sentences, replicas: what a 32-bit offset indexes
MAX_SEED = 2**31 - 1  # a seed every generator takes (torch, numpy, random) with room for per-rank offsets
MAX_GPUS = 256  # GPUs one replica may ask for: beyond any machine's, so a larger number is a mistake


def check_flags(record: object) -> None:
    """Each ``bool`` field of the dataclass ``record`` True or False: a string ("no", "false") would
    read as true, so any other value is a SettingError naming the field."""
    for f in fields(record):  # type: ignore[arg-type]
        value = getattr(record, f.name)
        if f.type not in ("bool", bool) or isinstance(value, bool):
            continue
        if not isinstance(value, np.bool_):
            raise SettingError(f"`{f.name}` must be true or false, got {type(value).__name__} {value!r}")
        object.__setattr__(record, f.name, bool(value))  # NumPy's: kept as Python's


def is_int(value: object) -> bool:
    """An integer that is not a bool (``True`` is an int to Python, never a count to a user)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_count(name: str, value: object, low: int = 1, high: int = MAX_COUNT, zero: str | None = None,
                optional: str | None = None) -> None:
    """``value`` an integer in [``low``, ``high``]. ``zero``: what 0 means, where ``low`` is 0;
    ``optional``: what None (the flag left out) means, where None is allowed."""
    if value is None and optional is not None:
        return
    if is_int(value) and low <= value <= high:  # type: ignore[operator]
        return
    notes = [f"at most {high}"] if low == 1 else []
    notes += [f"0: {zero}"] if zero else []
    notes += [f"left out: {optional}"] if optional else []
    what = "a positive integer" if low == 1 else f"an integer from {low} to {high}"
    said = f" ({'; '.join(notes)})" if notes else ""
    raise SettingError(f"`{name}` must be {what}{said}, got {value!r}")


def check_number(name: str, value: object, low: float, high: float, low_open: bool = False,
                 optional: str | None = None, unit: str = "") -> None:
    """``value`` a finite real number in [``low``, ``high``] (``low_open``: (``low``, ``high``]);
    ``optional``: what None means, where None is allowed. NaN and the infinities are refused."""
    if value is None and optional is not None:
        return
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        if (low < value if low_open else low <= value) and value <= high:
            return
    interval = f"{'(' if low_open else '['}{_shown(low)}, {_shown(high)}]"
    notes = f" (left out: {optional})" if optional else ""
    raise SettingError(f"`{name}` must be a finite number in {interval}{unit}{notes}, got {value!r}")


def _shown(x: float) -> str:
    """A bound as a person reads it: 60000, 3.40282e+38."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def check_gpus(name: str, value: object) -> None:
    """GPUs Ray gives one replica: 0 (none), a fraction of one GPU shared with other replicas, or a
    whole number of GPUs (Ray refuses a fraction above 1), at most ``MAX_GPUS``."""
    check_number(name, value, 0, MAX_GPUS, unit=" GPUs")
    if value > 1 and not float(value).is_integer():  # type: ignore[operator]
        raise SettingError(f"`{name}` above 1 must be a whole number of GPUs (a fraction shares one GPU), "
                           f"got {value!r}")


def setting(default: Any, help: str | None = None, group: str | None = None,  # noqa: A002
            choices: tuple | None = None, **meta: Any) -> Any:
    """A record's field and its flag's metadata (``elmo_cli.vocabulary.add_fields``): ``help``,
    ``group``, ``choices``, ``meaning`` (the shared flag it is), ``runtime_only`` (the same vectors
    whatever its value, so a resumed job may change it), ``parquet_only`` (the hdf5 layout has no
    place for it), ``cli=False`` (no flag of its own)."""
    return field(default=default, metadata={"help": help, "group": group, "choices": choices, **meta})
