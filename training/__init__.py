"""Pretraining and fine-tuning a biLM: corpus, vocabulary, objective, optimizer recipes, checkpoints, evaluation, the probe.
May import: elmo_core, runtime, corpora, inference (tests/test_layers.py)."""
