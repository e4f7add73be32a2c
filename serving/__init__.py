"""`elmo serve`: the HTTP app, the cross-request batcher, limits, metrics, Ray Serve and the Triton model repository.
May import: elmo_core, storage, runtime, corpora, formats, inference, export, training (tests/test_layers.py)."""
from elmo_core.process_env import settle

settle()  # first: the environment torch reads when it loads (elmo_core/process_env.py)
