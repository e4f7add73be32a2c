"""Making artifacts: the ONNX graph, its validation, int8 and on-demand exports, TensorRT engines, `elmo engine`'s build.
May import: elmo_core, runtime, corpora, formats, inference (tests/test_layers.py)."""
import elmo_core.process_env  # noqa: F401 (the environment torch reads when it loads, whatever is imported first)
