"""Where a model's files are (options.json and its weights), found without loading anything: what
``formats.model_dir`` loads and ``inference.registry.model_identity`` hashes (an ``elmo embed`` job's
model identity, compared with OUTPUT_DIR's job record before any model code loads)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from elmo_core.config import ElmoConfig
from elmo_core.errors import ConfigError, InputError, WeightsError
from storage.atomic import read_json_object
from storage.locations import is_uri, local_copy

OPTIONS_NAME = "options.json"
HDF5_NAME = "weights.hdf5"
NATIVE_NAME = "model.safetensors"


@dataclass(frozen=True)
class ModelFiles:
    """Where a model's options and weights are; ``format`` is 'hdf5' or 'safetensors'."""

    options: Path
    weights: Path

    @property
    def format(self) -> str:
        return "safetensors" if self.weights.suffix == ".safetensors" else "hdf5"

    def dictionaries(self) -> list[Path]:
        """The dictionary files options.json names (``dictionaries``: a model that takes token ids from
        them, ``elmo_core.dictionaries``), beside it; none for a byte-level model or options that do
        not parse (loading the model names that problem). Its vectors depend on them as on its weights."""
        try:
            found = ElmoConfig.from_json(self.options).dictionaries
        except (ConfigError, OSError, ValueError):
            return []
        return [] if found is None else [self.options.parent / n for n in (found.chars, found.words) if n]


def resolve_model(path: str | Path, weights: str | Path | None = None) -> ModelFiles:
    """A model's options and weights: a directory, or an options file (then ``weights`` is required).

    In a directory: ``options.json``, else the one ``*options*.json``; ``model.safetensors`` or
    ``weights.hdf5``, else the one ``*.hdf5`` that is not a softmax (``*softmax*``), preferring
    names with ``weights`` (the published ``elmo_..._options.json`` / ``elmo_..._weights.hdf5`` /
    ``elmo_..._softmax_weights.hdf5`` side by side). ``weights`` names the file explicitly. A URI
    (``s3://bucket/model``) is fetched once into the local cache (``storage.locations.local_copy``).
    """
    path = local_copy(path) if is_uri(path) else Path(path)
    if path.is_file() and path.suffix == ".json":
        if weights is None:
            raise WeightsError(f"{path}: an options file needs its weights file too (--weights FILE), "
                               f"or pass the model's directory")
        return ModelFiles(path, _existing(Path(weights)))
    if not path.is_dir():
        raise WeightsError(f"{path}: not a model directory or options.json; pass a directory or OPTIONS and WEIGHTS files")
    options = _options_in(path)
    return ModelFiles(options, _existing(Path(weights)) if weights is not None else _weights_in(path))


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise WeightsError(f"{path}: weights file not found")
    return path


def _options_in(path: Path) -> Path:
    if (path / OPTIONS_NAME).is_file():
        return path / OPTIONS_NAME
    if (path / "config.json").is_file() and (path / "encoder.pkl").is_file():
        raise WeightsError(f"{path}: an ELMoForManyLangs model; convert it first: elmo convert-efml --model {path} --out DIR")
    if kind := _export_kind(path):
        raise WeightsError(f"{path}: an {kind} export, not a model directory; this loads the model itself (options.json "
                           f"and its weights): give the directory the export was made from")
    if (path / "manifest.json").is_file():  # an export whose manifest its kind was not read from
        raise WeightsError(f"{path}: holds a manifest.json that is not an export's (not a JSON object with its "
                           f"\"kind\"; `elmo info --model {path}` says why) and no {OPTIONS_NAME}: export the model "
                           f"again, or give its model directory")
    jsons = sorted(path.glob("*options*.json"))
    if len(jsons) != 1:
        raise WeightsError(f"{path}: no {OPTIONS_NAME} in this directory"
                           + (f" and several *options*.json {[p.name for p in jsons]}" if jsons else ""))
    return jsons[0]


def _export_kind(path: Path) -> str | None:
    """The kind an export directory's manifest.json names (``export.manifest``), None for anything else."""
    try:
        kind = read_json_object(path / "manifest.json").get("kind")
    except (OSError, InputError):
        return None
    return kind if isinstance(kind, str) else None


def _weights_in(path: Path) -> Path:
    for name in (NATIVE_NAME, HDF5_NAME):
        if (path / name).is_file():
            return path / name
    hdf5 = sorted(p for p in path.glob("*.hdf5") if "softmax" not in p.name)
    named = [p for p in hdf5 if "weights" in p.name]
    for found in (hdf5, named):
        if len(found) == 1:
            return found[0]
    raise WeightsError(f"{path}: expected {HDF5_NAME}, {NATIVE_NAME} or one *weights*.hdf5 (found "
                       f"{[p.name for p in path.glob('*.hdf5')]}); name the file with --weights")
