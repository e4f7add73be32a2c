"""The `elmo` command line: argparse meets the library here, and library errors become exit codes.
May import: elmo_core, storage, runtime, corpora, formats, inference, export, training, pipelines, serving, probing (tests/test_layers.py)."""
from elmo_core.process_env import settle

settle()  # first: the environment torch reads when it loads (elmo_core/process_env.py)
