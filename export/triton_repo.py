"""``elmo export triton``: a Triton Inference Server model repository that serves ragged sentences.

Triton's dynamic batcher only puts requests of one shape into a batch, and sentences differ in
length; so the repository holds a Python-backend model (``export/triton_model.py``, copied as
``1/model.py``) that takes each request's tokens as BYTES, padded with empty strings to
(B, T), and runs every request of a batch through this project's backend in one call
(``Embedder.embed_sentences``: length-sorted, stateless). ``allow_ragged_batch`` lets requests of
different shapes share a batch. Outputs: ``EMBEDDINGS`` (B, T, D), the mixed layers (equal
weights) with zeros at padding, and ``SENTENCE_EMBEDDINGS`` (B, D), their mean over each
sentence's tokens. The model's own files are copied into ``1/model/``, so the repository moves as
one directory; the Triton server's Python environment needs this package installed.

    REPO/<name>/config.pbtxt
    REPO/<name>/1/model.py
    REPO/<name>/1/model/        options.json + weights (torch), or an `elmo export` directory
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from elmo_core.bounds import check_count, check_number
from elmo_core.errors import InputError
from storage.atomic import atomic_dir
from inference.registry import BACKEND_NAMES, artifact_file, backend_kind, exported_backend, model_config
from runtime import check_threads

MODEL_CODE = Path(__file__).with_name("triton_model.py")
KINDS = {"cpu": "KIND_CPU", "gpu": "KIND_GPU"}


@dataclass(frozen=True)
class TritonOptions:
    name: str = "elmo"
    backend: str | None = None  # None: an export directory's own, else torch (``write_triton_repository``)
    kind: str = "cpu"
    instances: int = 1
    max_batch_size: int = 64
    max_wait_ms: float = 2.0  # the dynamic batcher's max_queue_delay_microseconds, in ms
    threads: int | None = None  # the backend's threads per instance (default: its own)

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in BACKEND_NAMES:
            raise InputError(f"--backend must be one of {BACKEND_NAMES}, got {self.backend!r}")
        if self.kind not in KINDS:
            raise InputError(f"--kind must be one of {tuple(KINDS)}, got {self.kind!r}")
        for name in ("instances", "max_batch_size"):
            check_count(name, getattr(self, name))
        check_number("max_wait_ms", self.max_wait_ms, 0, 60_000, unit=" ms")
        check_threads(self.threads)
        if not self.name.replace("_", "").replace("-", "").isalnum():
            raise InputError(f"--name must be letters, digits, '-' or '_', got {self.name!r}")


def config_pbtxt(options: TritonOptions, dim: int) -> str:
    """The model's config.pbtxt (protobuf text format)."""
    parameters = {"backend": options.backend, "threads": str(options.threads or "")}
    params = ",\n".join(f'  {{ key: "{k}" value: {{ string_value: {json.dumps(v)} }} }}' for k, v in parameters.items())
    return f"""name: "{options.name}"
backend: "python"
max_batch_size: {options.max_batch_size}
input [
  {{ name: "TOKENS" data_type: TYPE_STRING dims: [ -1 ] allow_ragged_batch: true }}
]
output [
  {{ name: "EMBEDDINGS" data_type: TYPE_FP32 dims: [ -1, {dim} ] }},
  {{ name: "SENTENCE_EMBEDDINGS" data_type: TYPE_FP32 dims: [ {dim} ] }}
]
instance_group [ {{ count: {options.instances} kind: {KINDS[options.kind]} }} ]
dynamic_batching {{ max_queue_delay_microseconds: {round(options.max_wait_ms * 1000)} }}
parameters [
{params}
]
"""


def _copy_model(model: Path, backend: str, weights: str | None, dest: Path) -> None:
    from formats.model_dir import HDF5_NAME, NATIVE_NAME, OPTIONS_NAME, resolve_model

    if not backend_kind(backend).exported:
        files = resolve_model(model, weights)
        dest.mkdir(parents=True)
        shutil.copy2(files.options, dest / OPTIONS_NAME)
        shutil.copy2(files.weights, dest / (NATIVE_NAME if files.format == "safetensors" else HDF5_NAME))
        for path in files.dictionaries():
            shutil.copy2(path, dest / path.name)
    else:
        artifact_file(model, backend)  # a clear error for a directory that is not such an export
        shutil.copytree(model, dest)


def write_triton_repository(model: str | Path, out: str | Path, options: TritonOptions,
                            weights: str | None = None) -> Path:
    """Write ``out/<name>/`` (``out`` may hold other models; ``<name>`` must not exist yet); ``options.backend``
    None: the export's own for an export directory, else torch."""
    model, out = Path(model), Path(out)
    options = replace(options, backend=options.backend or exported_backend(model) or "torch")
    if weights is not None and backend_kind(options.backend).exported:
        raise InputError(f"--weights {weights}: an {options.backend} model runs its export's own graph, so there are "
                         f"no weights to choose: leave --weights out (or give them to elmo export onnx)")
    dim = model_config(model, options.backend, weights).output_dim
    target = out / options.name
    if target.exists():
        raise InputError(f"{target} exists: choose another --out or --name, or remove it")
    if backend_kind(options.backend).exported:
        from formats.export_manifest import read_spec

        _, spec = read_spec(model, options.backend)
        if spec.vectors.mode.mixes:  # the repository's model mixes the layers of every request itself
            raise InputError(f"{model}: a mixed export (--output mixed) gives one fixed mix, and a Triton model "
                             f"mixes every layer by its request: export with --output all (the default) for Triton")
    with atomic_dir(target, "config.pbtxt") as tmp:  # the model appears whole, or not at all
        version = tmp / "1"
        _copy_model(model, options.backend, weights, version / "model")
        shutil.copy2(MODEL_CODE, version / "model.py")
        (tmp / "config.pbtxt").write_text(config_pbtxt(options, dim), encoding="utf-8")
    return target
