"""`elmo serve`: the HTTP app, the cross-request batcher, limits, metrics, Ray Serve and the Triton model repository.
May import: elmo_core, runtime, corpora, formats, inference, export, training (tests/test_layers.py)."""
import elmo_core.process_env  # noqa: F401 (the environment torch reads when it loads, whatever is imported first)
