"""manifest.json beside every exported artifact: what it is, where it came from, how it was checked.

The export format's one home: `elmo export` writes it, the ONNX Runtime and TensorRT backends read it.
"""
from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from storage.atomic import digest, read_json_object, write_json_atomic
from elmo_core.errors import InputError
from storage.locations import file_sha256

from .errors import ExportError
from .export_spec import ExportSpec

MANIFEST_NAME = "manifest.json"
ONNX_NAME = "model.onnx"  # an `elmo export onnx` directory's graph
ENGINE_NAME = "model.engine"  # an `elmo export tensorrt` directory's serialized engine
FORMAT_VERSION = 1


def producer() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch

    from importlib.metadata import PackageNotFoundError, version
    try:
        own = version("elmo-pipeline")
    except PackageNotFoundError:
        own = "unknown"
    return {"elmo_pipeline": own, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "torch": torch.__version__, "python": platform.python_version()}


DIGEST_KEY = "manifest_sha256"  # of the manifest's other keys: an edited manifest is found, not obeyed
# the sections each kind's readers index (an older manifest may lack the digest: these are checked still)
SECTIONS = {"onnx": ("source", "onnx", "spec"), "tensorrt": ("source",)}


def _digest(manifest: dict[str, Any]) -> str:
    return digest({k: v for k, v in manifest.items() if k != DIGEST_KEY})


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> Path:
    """``manifest`` as OUT/manifest.json, with the digest of its contents (``DIGEST_KEY``)."""
    path = Path(out_dir) / MANIFEST_NAME
    write_json_atomic(path, {**manifest, DIGEST_KEY: _digest(manifest)}, sort_keys=False)
    return path


def read_manifest(export_dir: str | Path, kind: str = "onnx") -> dict[str, Any]:
    """The manifest of an export directory, checked for its kind ('onnx' or 'tensorrt')."""
    path = Path(export_dir) / MANIFEST_NAME
    if not path.is_file():
        raise ExportError(f"{export_dir}: no {MANIFEST_NAME}; is this a directory written by `elmo export {kind}`?")
    try:
        manifest = read_json_object(path)
    except InputError as e:
        raise ExportError(str(e)) from None
    if manifest.get("kind") != kind:
        raise ExportError(f"{path}: a {manifest.get('kind')!r} manifest, expected {kind!r} "
                          f"(use the `elmo export {kind}` output)")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ExportError(f"{path}: manifest format {manifest.get('format_version')}, this version reads "
                          f"{FORMAT_VERSION}; re-export")
    if DIGEST_KEY in manifest and manifest[DIGEST_KEY] != _digest(manifest):
        raise ExportError(f"{path}: edited after the export (its {DIGEST_KEY} is not its contents'): what it says "
                          f"the graph computes may not be what it computes; re-export")
    if bad := [k for k in SECTIONS.get(kind, ()) if not isinstance(manifest.get(k), dict)]:
        raise ExportError(f"{path}: its {bad} section(s) missing or not objects; re-export")
    return manifest


def read_spec(export_dir: str | Path, kind: str = "onnx") -> tuple[dict[str, Any], ExportSpec]:
    manifest = read_manifest(export_dir, kind)
    if "spec" not in manifest:
        raise ExportError(f"{Path(export_dir) / MANIFEST_NAME}: no 'spec' section; re-export")
    return manifest, ExportSpec.from_dict(manifest["spec"], str(Path(export_dir) / MANIFEST_NAME))


def check_file(export_dir: str | Path, entry: dict[str, Any]) -> Path:
    """The artifact a manifest entry names ({'file', 'sha256'}), verified against its hash."""
    path = Path(export_dir) / entry["file"]
    if not path.is_file():
        raise ExportError(f"{path}: missing (named in {MANIFEST_NAME})")
    digest = file_sha256(path)
    if digest != entry["sha256"]:
        raise ExportError(f"{path}: sha256 {digest[:12]}... does not match the manifest's {entry['sha256'][:12]}...; "
                          f"the file was changed after export: re-export")
    return path
