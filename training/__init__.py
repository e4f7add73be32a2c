"""Pretraining and fine-tuning a biLM: corpus, vocabulary, objective, optimizer recipes, checkpoints, evaluation.
May import: elmo_core, runtime, corpora, formats, inference (tests/test_layers.py)."""
import elmo_core  # noqa: F401  (first: it settles the process's environment before torch loads: elmo_core.process_env)
