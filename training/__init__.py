"""Pretraining and fine-tuning a biLM: corpus, vocabulary, objective, optimizer recipes, checkpoints, evaluation, the probe.
May import: elmo_core, runtime, corpora, formats, inference (tests/test_layers.py)."""
import runtime  # noqa: F401 (first: OpenMP's wait policy is set before torch loads; runtime.cpus)
