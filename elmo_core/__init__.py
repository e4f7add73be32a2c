"""The ground floor: the reference model (config, char ids, char-CNN, LSTM, biLM, scalar mix), its kinds and names.
May import: no other package of the project (tests/test_layers.py)."""
# The package's names load their modules on first use (PEP 562), so a light module (errors, bounds,
# kinds) is imported without torch; the process environment is settled first, whatever is imported.
from __future__ import annotations

from .errors import ConfigError, ElmoError, InputError, WeightsError
from .lazy_names import lazy_names
from .process_env import settle

settle()  # before any module here loads torch: the environment torch reads when it loads (elmo_core/process_env.py)

_HOMES = {"BiLM": "bilm", "BiLMOutput": "bilm", "StatefulBiLM": "bilm", "batch_to_ids": "chars",
          "tokens_to_char_ids": "chars", "CharCnnConfig": "config", "ElmoConfig": "config", "LstmConfig": "config",
          "TrainingConfig": "config", "LstmState": "lstm", "POOLS": "pooling", "pool_tokens": "pooling",
          "ScalarMix": "scalar_mix"}

__all__ = ["ConfigError", "ElmoError", "InputError", "WeightsError", *_HOMES]

__getattr__ = lazy_names(__name__, _HOMES, globals())
