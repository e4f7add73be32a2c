"""What a door was asked about how the model runs, checked once: ``RunSettings``.

The flags of a run (``--backend``, ``--device``, ``--threads``, ``--precision``, ``--layout``,
``--weights``, ``--token-embeddings``, ``--token-vocab``) become this record where they are parsed
(``elmo embed`` generates its flags from its fields, ``elmo_cli.vocabulary.add_fields``), or from a
library caller's keywords (``resolve_run``, ``embed_parquet``). ``inference.model_run.resolve_run``
turns it into the one ``ModelRun``, which settles what the settings leave open (the backend of an
export directory, ``auto``, the thread count, the layout, the batch budget) and is what runs. Torch-free:
the record is made and checked before any model code loads.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from elmo_core.bounds import setting
from elmo_core.errors import InputError, SettingError
from elmo_core.kinds import Precision
from elmo_core.names import LAYOUTS
from runtime import check_threads

from .registry import BACKEND_NAMES

DEVICE_PATTERN = r"cpu|cuda(:\d+)?"


def check_device_name(device: object) -> None:
    """``--device``'s form (cpu, cuda or cuda:N; whether this machine has it: ``registry.check_device``)."""
    if not isinstance(device, str) or not re.fullmatch(DEVICE_PATTERN, device):
        raise SettingError(f"`device` must be cpu, cuda or cuda:N, got {device!r}")


@dataclass(frozen=True)
class RunSettings:
    """How the model is asked to run; None: the run decides (``ModelRun``'s reasons say how)."""

    # None: an export's own backend, else torch
    backend: str | None = setting(None, None, "running", meaning="backend", choices=BACKEND_NAMES)
    device: str = setting("cpu", "cpu, cuda or cuda:N: where the torch / onnx backend runs", "running",
                          meaning="device", runtime_only=True)
    threads: int | None = setting(None, "the model's threads (default: every core for a model whose compute "
                                  "dominates the job, all but one for a small model; see docs/pipelines.md)",
                                  "running", meaning="threads", runtime_only=True)
    precision: str | None = setting(None, cli=False)  # the flag: elmo_cli.run_args; None: the backend's default
    layout: str | None = setting(None, cli=False, runtime_only=True)  # the flag: elmo_cli.run_args; None: auto
    # the job's identity holds the weights' sha256
    weights: str | None = setting(None, None, "running", meaning="weights", runtime_only=True)
    token_embeddings: str | None = setting(None, None, "running", meaning="token_embeddings", runtime_only=True)
    token_vocab: str | None = setting(None, None, "running", meaning="token_vocab", runtime_only=True)

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in BACKEND_NAMES:
            raise SettingError(f"`backend` must be one of {list(BACKEND_NAMES)}, got {self.backend!r}")
        check_device_name(self.device)
        check_threads(self.threads)
        if self.precision is not None and self.precision not in (*Precision.ALL, "auto"):
            raise SettingError(f"`precision` must be one of {[*Precision.ALL, 'auto']}, got {self.precision!r}")
        if self.layout is not None and self.layout not in LAYOUTS:
            raise SettingError(f"`layout` must be one of {list(LAYOUTS)}, got {self.layout!r}")
        for name in ("weights", "token_embeddings", "token_vocab"):
            value = getattr(self, name)
            if isinstance(value, Path):
                object.__setattr__(self, name, str(value))

    @property
    def auto_on_cpu(self) -> bool:
        """``--precision auto`` for the torch backend on a CPU: judged by that CPU's flags (a cluster's
        worker's, where the model runs there: ``resolve_run``'s ``flags``)."""
        return self.precision == "auto" and self.device == "cpu" and self.backend in (None, "torch")

    @classmethod
    def split(cls, options: dict[str, Any]) -> tuple["RunSettings", dict[str, Any]]:
        """(the run's settings among ``options``, the rest): a library caller's keywords."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in options.items() if k in names}), \
            {k: v for k, v in options.items() if k not in names}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


RUN_SETTINGS = tuple(RunSettings.__dataclass_fields__)
