"""The ground floor: the reference model (config, char ids, char-CNN, LSTM, biLM, scalar mix) and where bytes live (storage, atomic writes).
May import: no other package of the project (tests/test_layers.py)."""
from . import process_env  # noqa: F401 (first: sets the environment torch's OpenMP and oneDNN read when torch loads)
from .bilm import BiLM, BiLMOutput, StatefulBiLM
from .chars import batch_to_ids, tokens_to_char_ids
from .config import CharCnnConfig, ElmoConfig, LstmConfig, TrainingConfig
from .errors import ConfigError, ElmoError, InputError, WeightsError
from .lstm import LstmState
from .pooling import POOLS, pool_tokens
from .scalar_mix import ScalarMix

__all__ = [
    "BiLM", "BiLMOutput", "StatefulBiLM", "batch_to_ids", "tokens_to_char_ids", "CharCnnConfig",
    "ElmoConfig", "LstmConfig", "TrainingConfig", "ConfigError", "ElmoError", "InputError",
    "WeightsError", "LstmState", "ScalarMix", "POOLS",
    "pool_tokens",
]
