"""The ground floor: the reference model (config, char ids, char-CNN, LSTM, biLM, scalar mix) and where bytes live (storage, atomic writes).
May import: no other package of the project (tests/test_layers.py)."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .process_env import settle

# Importing it settles the process's environment first and loads nothing else: its names load from
# their modules when first asked for, so every package imports it first at no cost (process_env).
settle()

_HOMES = {"BiLM": "bilm", "BiLMOutput": "bilm", "StatefulBiLM": "bilm", "batch_to_ids": "chars",
          "tokens_to_char_ids": "chars", "CharCnnConfig": "config", "ElmoConfig": "config", "LstmConfig": "config",
          "TrainingConfig": "config", "ConfigError": "errors", "ElmoError": "errors", "InputError": "errors",
          "WeightsError": "errors", "LstmState": "lstm", "POOLS": "pooling", "pool_tokens": "pooling",
          "ScalarMix": "scalar_mix"}
__all__ = list(_HOMES)

if TYPE_CHECKING:
    from .bilm import BiLM, BiLMOutput, StatefulBiLM
    from .chars import batch_to_ids, tokens_to_char_ids
    from .config import CharCnnConfig, ElmoConfig, LstmConfig, TrainingConfig
    from .errors import ConfigError, ElmoError, InputError, WeightsError
    from .lstm import LstmState
    from .pooling import POOLS, pool_tokens
    from .scalar_mix import ScalarMix


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
