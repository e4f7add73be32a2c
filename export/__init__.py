"""Making artifacts: the ONNX graph, its validation, int8 and on-demand exports, TensorRT engines, `elmo engine`'s build.
May import: elmo_core, storage, runtime, corpora, formats, inference (tests/test_layers.py)."""
from elmo_core.process_env import settle

settle()  # first: the environment torch reads when it loads (elmo_core/process_env.py)
