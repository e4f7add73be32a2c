"""The `elmo` command line: argparse meets the library here, and library errors become exit codes.
May import: elmo_core, runtime, corpora, formats, inference, export, training, pipelines, serving, probing (tests/test_layers.py)."""
import elmo_core  # noqa: F401  (first: it settles the process's environment before torch loads: elmo_core.process_env)
