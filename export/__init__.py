"""Making artifacts: the ONNX graph, its validation, int8 and on-demand exports, TensorRT engines, `elmo engine`'s build.
May import: elmo_core, runtime, corpora, formats, inference (tests/test_layers.py)."""
import elmo_core  # noqa: F401  (first: it settles the process's environment before torch loads: elmo_core.process_env)
