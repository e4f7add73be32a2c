"""Finding, loading and saving models: published (options.json + hdf5) and native (safetensors)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .bilm import BiLM
from .config import ElmoConfig
from .errors import WeightsError
from .weights_hdf5 import load_hdf5_weights, save_hdf5_weights

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


def resolve_model(path: str | Path, weights: str | Path | None = None) -> ModelFiles:
    """A model directory (options.json + weights.hdf5 / model.safetensors / one *.hdf5), or files."""
    path = Path(path)
    if weights is not None:
        return ModelFiles(path, Path(weights))
    if not path.is_dir():
        raise WeightsError(f"{path}: not a model directory; pass a directory or OPTIONS and WEIGHTS files")
    options = path / OPTIONS_NAME
    if not options.is_file():
        jsons = sorted(path.glob("*options*.json"))
        if len(jsons) != 1:
            raise WeightsError(f"{path}: no {OPTIONS_NAME} in this directory")
        options = jsons[0]
    for name in (NATIVE_NAME, HDF5_NAME):
        if (path / name).is_file():
            return ModelFiles(options, path / name)
    hdf5 = sorted(path.glob("*.hdf5"))
    if len(hdf5) == 1:
        return ModelFiles(options, hdf5[0])
    raise WeightsError(f"{path}: expected {HDF5_NAME} or {NATIVE_NAME} (found {[p.name for p in hdf5]})")


def load_bilm(path: str | Path, weights: str | Path | None = None) -> BiLM:
    """Load a biLM from a model directory or from options + weights files, in eval mode."""
    files = resolve_model(path, weights)
    model = BiLM(ElmoConfig.from_json(files.options))
    if files.format == "safetensors":
        load_native_weights(model, files.weights)
    else:
        load_hdf5_weights(model, files.weights)
    return model.eval()


def load_native_weights(model: BiLM, path: str | Path) -> None:
    """Safetensors: plain tensors, no pickle. Names and shapes must match the model exactly."""
    try:
        tensors = load_file(str(path))
    except (FileNotFoundError, SafetensorError, OSError) as e:
        raise WeightsError(f"{path}: cannot read safetensors weights ({e})") from None
    expected = model.state_dict()
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise WeightsError(f"{path}: tensors missing {missing}, unexpected {extra}")
    for name, value in tensors.items():
        if tuple(value.shape) != tuple(expected[name].shape):
            raise WeightsError(f"{path}: tensor '{name}' has shape {tuple(value.shape)}, expected {tuple(expected[name].shape)}")
    model.load_state_dict(tensors)


def save_model(model: BiLM, out_dir: str | Path, fmt: str = "hdf5") -> ModelFiles:
    """Write options.json and the weights (``fmt`` 'hdf5' = published layout, or 'safetensors')."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.config.to_json(out_dir / OPTIONS_NAME)
    if fmt == "hdf5":
        save_hdf5_weights(model, out_dir / HDF5_NAME)
        return ModelFiles(out_dir / OPTIONS_NAME, out_dir / HDF5_NAME)
    if fmt == "safetensors":
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        tmp = out_dir / f".{NATIVE_NAME}.tmp"
        save_file(state, str(tmp))
        tmp.replace(out_dir / NATIVE_NAME)
        return ModelFiles(out_dir / OPTIONS_NAME, out_dir / NATIVE_NAME)
    raise WeightsError(f"unknown weights format {fmt!r}; use 'hdf5' or 'safetensors'")


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
