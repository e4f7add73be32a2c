"""Loading ELMoForManyLangs (HIT-SCIR) model directories into our biLM.

A model directory holds ``config.json`` (its training options; ``config_path`` names the
architecture JSON), ``char.dic`` and ``word.dic`` (see ``elmo_core.dictionaries``), and
``token_embedder.pkl`` / ``encoder.pkl``: ``torch.save`` of plain state dicts, read here with
``torch.load(weights_only=True)`` only, never unpickled beyond tensors.

Their conventions, each converted in a named step below (elmoformanylangs 0.0.4.post2):
- char embedding: every row as stored (padding characters have trained rows); ours keeps row 0
  as the masked-token row, so their id k is our k + 1;
- highway: ``x = g * x + (1 - g) * relu(W1 x + b1)``, ``g = sigmoid(W2 x + b2)``: ``g`` carries the
  input, where ours gates the transform, so our carry weights are ``-W2``, ``-b2``;
- projection input ``[word embedding; highway output]``, torch ``Linear`` orientation (out, in);
- LSTM: gates in the order i, f, g, o with no forget bias added at run time (ours: i, j, f, o
  and +1 on f at run time, as TF): reordered, and 1 taken off the forget bias; the input product
  has no bias, the state product has the bias; projection (P, C) transposed;
- layers above the first add their input (skip connections); layer 0 is ``[x; x]``.
"""
from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import torch

from elmo_core.bilm import BiLM
from elmo_core.config import CharCnnConfig, DictionaryConfig, ElmoConfig, LstmConfig
from elmo_core.dictionaries import CHAR_SPECIALS, WORD_SPECIALS, DictionaryTokenizer
from elmo_core.errors import WeightsError

from .model_dir import read_dictionary

# The architecture file their released models name (configs/cnn_50_100_512_4096_sample.json in
# their package; cnn_0_100_512_4096_sample.json is the same): found here when a released
# config.json names it by an absolute path on its authors' machine.
RELEASED_ARCHITECTURE = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
    "token_embedder": {"name": "cnn", "activation": "relu", "n_highway": 2, "word_dim": 100, "char_dim": 50,
                       "max_characters_per_token": 50,
                       "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]},
}
RELEASED_NAMES = ("cnn_50_100_512_4096_sample.json", "cnn_0_100_512_4096_sample.json")


def load_efml(model_dir: str | Path) -> BiLM:
    """An ELMoForManyLangs model directory as our biLM (eval mode), with its dictionary tokenizer."""
    model_dir = Path(model_dir)
    arch = _load_architecture(model_dir)
    chars = read_dictionary(model_dir / "char.dic", CHAR_SPECIALS)
    word_dim = arch["token_embedder"].get("word_dim", 0)
    words = read_dictionary(model_dir / "word.dic", WORD_SPECIALS) if isinstance(word_dim, int) and word_dim > 0 \
        else None
    config = _elmo_config(arch, len(chars), len(words) if words is not None else 0, str(model_dir))
    model = BiLM(config, DictionaryTokenizer(chars, words, config.char_cnn.max_characters_per_token))
    token_embedder = _load_state(model_dir / "token_embedder.pkl")
    encoder = _load_state(model_dir / "encoder.pkl")
    with torch.no_grad():
        _load_token_embedder(token_embedder, model, model_dir / "token_embedder.pkl")
        _load_encoder(encoder, model, model_dir / "encoder.pkl")
    return model.eval()


def _load_architecture(model_dir: Path) -> dict:
    """The architecture (its ``encoder`` and ``token_embedder`` objects), found as they find it."""
    arch = _find_architecture(model_dir)
    missing = [k for k in ("encoder", "token_embedder") if not isinstance(arch, dict) or not isinstance(arch.get(k), dict)]
    if missing:
        raise WeightsError(f"{model_dir}: the architecture file named by config.json has no {missing} object(s); "
                           f"ELMoForManyLangs' files hold both (see its configs/*.json)")
    return arch


def _find_architecture(model_dir: Path) -> object:
    """Their lookup order: ``config_path`` under the directory, then its base name there, then the
    package's own configs (ours: the released architecture)."""
    try:
        path = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))["config_path"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise WeightsError(f"{model_dir / 'config.json'}: no readable 'config_path' ({e})") from None
    if not isinstance(path, str):
        raise WeightsError(f"{model_dir / 'config.json'}: 'config_path' must be a file name, got {path!r}")
    for candidate in (model_dir / path, model_dir / Path(path).name):
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError) as e:
                raise WeightsError(f"{candidate}: not a readable JSON architecture file ({e})") from None
    if Path(path).name in RELEASED_NAMES:
        return RELEASED_ARCHITECTURE
    raise WeightsError(f"{model_dir}: the architecture file {path!r} named by config.json is not there; "
                       f"copy it into the model directory")


def _elmo_config(arch: dict, n_chars: int, n_words: int, where: str) -> ElmoConfig:
    try:
        return _architecture(arch, n_chars, n_words, where)
    except KeyError as e:
        raise WeightsError(f"{where}: the architecture file has no key {e}; ELMoForManyLangs' files name every "
                           f"key of 'encoder' and 'token_embedder' (see its configs/*.json)") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise WeightsError(f"{where}: the architecture file has a value of the wrong type ({e})") from None


def _architecture(arch: dict, n_chars: int, n_words: int, where: str) -> ElmoConfig:
    enc, te = arch["encoder"], arch["token_embedder"]
    if enc.get("name", "").lower() != "elmo" or te.get("name", "").lower() != "cnn":
        raise WeightsError(f"{where}: encoder {enc.get('name')!r} / token embedder {te.get('name')!r}: only "
                           f"'elmo' / 'cnn' models (every released one) are supported")
    if te.get("char_dim", 0) <= 0:
        raise WeightsError(f"{where}: a model without characters (char_dim 0) is not an ELMo char-CNN model")
    word_dim = te.get("word_dim", 0)
    return ElmoConfig(
        char_cnn=CharCnnConfig(embedding_dim=te["char_dim"], filters=tuple(tuple(f) for f in te["filters"]),
                               n_highway=te["n_highway"], n_characters=n_chars + 1,
                               max_characters_per_token=te["max_characters_per_token"], activation=te["activation"]),
        lstm=LstmConfig(dim=enc["dim"], projection_dim=enc["projection_dim"], n_layers=enc["n_layers"],
                        cell_clip=float(enc["cell_clip"]) if enc.get("cell_clip") else None,
                        proj_clip=float(enc["proj_clip"]) if enc.get("proj_clip") else None,
                        use_skip_connections=True),
        dictionaries=DictionaryConfig("char.dic", "word.dic" if word_dim else None, word_dim, n_words),
    )


def _load_state(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise WeightsError(f"{path}: not found")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own, about loading: this message says what matters
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise WeightsError(f"{path}: refused: not a plain state dict of tensors (other Python objects, or no "
                           f"pickle at all); a file given here is never unpickled beyond that") from None
    except (PermissionError, FileNotFoundError, IsADirectoryError):
        raise  # the system's own words name them
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        why = (str(e).splitlines() or [""])[0] or type(e).__name__
        raise WeightsError(f"{path}: truncated, or not a torch state dict ({why}); copy the model's files "
                           f"again") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path}: expected a state dict of tensors, got {type(state).__name__}")
    return state


def _take(state: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], path: Path) -> torch.Tensor:
    if name not in state:
        raise WeightsError(f"{path}: no tensor '{name}'")
    value = state.pop(name)
    if tuple(value.shape) != shape:
        raise WeightsError(f"{path}: '{name}' has shape {tuple(value.shape)}, the config implies {shape}")
    return value.float()


def _load_token_embedder(state: dict[str, torch.Tensor], model: BiLM, path: Path) -> None:
    enc, cc = model.encoder, model.config.char_cnn
    F, P = cc.n_filters, model.config.lstm.projection_dim
    enc.char_embed.zero_()
    enc.char_embed[1:] = _take(state, "char_emb_layer.embedding.weight", (cc.n_characters - 1, cc.embedding_dim), path)
    for k, ((w, n), conv) in enumerate(zip(cc.filters, enc.convs)):
        conv.weight.copy_(_take(state, f"convolutions.{k}.weight", (n, cc.embedding_dim, w), path))
        conv.bias.copy_(_take(state, f"convolutions.{k}.bias", (n,), path))
    for k in range(cc.n_highway):
        W = _take(state, f"highways._layers.{k}.weight", (2 * F, F), path)  # (2F, F): [transform; carry of x]
        b = _take(state, f"highways._layers.{k}.bias", (2 * F,), path)
        enc.highway.weight[k] = torch.cat([W[:F].T, -W[F:].T], dim=1)  # (F, 2F): [W_transform | W_carry]
        enc.highway.bias[k] = torch.cat([b[:F], -b[F:]])
    word_dim = 0
    if enc.word_embed is not None:
        n_words, word_dim = enc.word_embed.shape[0] - 1, enc.word_embed.shape[1]
        enc.word_embed.zero_()
        enc.word_embed[1:] = _take(state, "word_emb_layer.embedding.weight", (n_words, word_dim), path)
    enc.proj_weight.copy_(_take(state, "projection.weight", (P, word_dim + F), path).T)  # (Dw+F, P)
    enc.proj_bias.copy_(_take(state, "projection.bias", (P,), path))
    _check_all_used(state, path)


def _gates_to_tf(w: torch.Tensor) -> torch.Tensor:
    """Their gate blocks i, f, g, o (dim 0) in TF's order i, j(=g), f, o."""
    i, f, g, o = w.chunk(4, dim=0)
    return torch.cat([i, g, f, o], dim=0)


def _load_encoder(state: dict[str, torch.Tensor], model: BiLM, path: Path) -> None:
    lstm, ls = model.lstm, model.config.lstm
    C, P = ls.dim, ls.projection_dim
    for layer in range(ls.n_layers):
        for d, direction in enumerate(("forward", "backward")):
            name = f"{direction}_layer_{layer}"
            lstm.w_input[layer, d] = _gates_to_tf(_take(state, f"{name}.input_linearity.weight", (4 * C, P), path)).T
            lstm.w_state[layer, d] = _gates_to_tf(_take(state, f"{name}.state_linearity.weight", (4 * C, P), path)).T
            bias = _gates_to_tf(_take(state, f"{name}.state_linearity.bias", (4 * C,), path))
            bias[2 * C : 3 * C] -= 1.0  # ours adds TF's forget bias of 1 at run time; theirs adds none
            lstm.bias[layer, d] = bias
            lstm.w_proj[layer, d] = _take(state, f"{name}.state_projection.weight", (P, C), path).T
    _check_all_used(state, path)


def _check_all_used(state: dict[str, torch.Tensor], path: Path) -> None:
    if state:
        raise WeightsError(f"{path}: tensors the config does not use: {sorted(state)[:6]}; does the architecture "
                           f"file match these weights?")
