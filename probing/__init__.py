"""What a model has learnt: the word probe (``elmo probe``), its picture, and the sentence search over pooled ``elmo embed`` output.
May import: elmo_core, storage, runtime, corpora, formats, inference, export, training, pipelines, serving (tests/test_layers.py)."""
from elmo_core.process_env import settle

settle()  # first: the environment torch reads when it loads (elmo_core/process_env.py)
