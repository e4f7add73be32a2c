"""Loading and saving models, published (options.json + hdf5) and native (safetensors); their files are
found by ``model_files``."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from storage.atomic import atomic_path, write_json_atomic
from elmo_core.bilm import BiLM
from elmo_core.config import ElmoConfig
from elmo_core.dictionaries import CHAR_SPECIALS, WORD_SPECIALS, DictionaryTokenizer
from elmo_core.errors import WeightsError
from .model_files import HDF5_NAME, NATIVE_NAME, OPTIONS_NAME, ModelFiles, resolve_model  # noqa: F401
from .weights_hdf5 import load_hdf5_weights, save_hdf5_weights


def load_bilm(path: str | Path, weights: str | Path | None = None) -> BiLM:
    """Load a biLM from a model directory or from options + weights files, in eval mode."""
    files = resolve_model(path, weights)
    config = ElmoConfig.from_json(files.options)
    model = BiLM(config, load_tokenizer(config, files.options.parent) if config.dictionaries is not None else None)
    load_weights(model, files)
    return model.eval()


def load_weights(model: BiLM, files: ModelFiles) -> None:
    """Fill ``model`` from ``files``' weights, safetensors or published hdf5."""
    if files.format == "safetensors":
        load_native_weights(model, files.weights)
    else:
        load_hdf5_weights(model, files.weights)


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
    if model.encoder.word_embed is not None and fmt == "hdf5":
        raise WeightsError("the published hdf5 layout has no word embedding; save this model as safetensors")
    write_json_atomic(out_dir / OPTIONS_NAME, model.config.to_dict(), sort_keys=False)
    if isinstance(model.tokenizer, DictionaryTokenizer):
        save_dictionaries(model.tokenizer, model.config, out_dir)
    if fmt == "hdf5":
        save_hdf5_weights(model, out_dir / HDF5_NAME)
        return ModelFiles(out_dir / OPTIONS_NAME, out_dir / HDF5_NAME)
    if fmt == "safetensors":
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        with atomic_path(out_dir / NATIVE_NAME) as tmp:
            save_file(state, str(tmp))
        return ModelFiles(out_dir / OPTIONS_NAME, out_dir / NATIVE_NAME)
    raise WeightsError(f"unknown weights format {fmt!r}; use 'hdf5' or 'safetensors'")


def read_dictionary(path: str | Path, specials: Sequence[str]) -> dict[str, int]:
    """An ELMoForManyLangs dictionary file, checked: ids 0..n-1 once each, ``specials`` present.

    Their format, kept: UTF-8, one ``token<TAB>id`` per line; lines split as Python's
    ``str.splitlines`` does (their ``codecs.open`` splits on every Unicode line break); a line that
    ``strip()`` leaves with one field is the character U+3000 (a whitespace character stripped
    away: their loader inserts it).
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: dictionary file not found")
    out: dict[str, int] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        fields = line.strip().split("\t")
        if len(fields) == 1:
            fields.insert(0, "\u3000")  # their loader's rule for a character that strip() removed
        try:
            out[fields[0]] = int(fields[1])
        except ValueError:
            raise WeightsError(f"{path}: line {n + 1} is not 'token<TAB>id' ({line!r})") from None
    if sorted(out.values()) != list(range(len(out))):
        raise WeightsError(f"{path}: ids must be 0..{len(out) - 1}, each once (the embedding has one row per entry)")
    missing = [s for s in specials if s not in out]
    if missing:
        raise WeightsError(f"{path}: lacks the special entries {missing}")
    return out


def load_tokenizer(config: ElmoConfig, model_dir: Path) -> DictionaryTokenizer:
    """A dictionary model's tokenizer, from the dictionary files its options name."""
    d = config.dictionaries
    assert d is not None
    chars = read_dictionary(model_dir / d.chars, CHAR_SPECIALS)
    words = read_dictionary(model_dir / d.words, WORD_SPECIALS) if d.words else None
    if len(chars) + 1 != config.char_cnn.n_characters:
        raise WeightsError(f"{model_dir / d.chars}: {len(chars)} characters, but the options say n_characters "
                           f"{config.char_cnn.n_characters} (entries + the padding row)")
    if words is not None and len(words) != d.n_words:
        raise WeightsError(f"{model_dir / d.words}: {len(words)} words, but the options say n_words {d.n_words}")
    return DictionaryTokenizer(chars, words, config.char_cnn.max_characters_per_token)


def save_dictionaries(tokenizer: DictionaryTokenizer, config: ElmoConfig, out_dir: Path) -> None:
    d = config.dictionaries
    assert d is not None
    named = [(d.chars, tokenizer.chars)] + ([(d.words, tokenizer.words)] if d.words and tokenizer.words else [])
    for name, table in named:
        (out_dir / name).write_text("".join(f"{t}\t{i}\n" for t, i in table.items()), encoding="utf-8")
