"""Pretraining and fine-tuning a biLM: corpus, vocabulary, objective, optimizer recipes, checkpoints, evaluation.
May import: elmo_core, storage, runtime, corpora, formats, inference (tests/test_layers.py)."""
from elmo_core.process_env import settle

settle()  # first: the environment torch reads when it loads (elmo_core/process_env.py)
