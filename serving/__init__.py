"""`elmo serve`: the HTTP app, the cross-request batcher, limits, metrics, Ray Serve and the Triton model repository.
May import: elmo_core, runtime, corpora, formats, inference, export, training (tests/test_layers.py)."""
import elmo_core  # noqa: F401  (first: it settles the process's environment before torch loads: elmo_core.process_env)
