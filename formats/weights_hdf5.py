"""Read and write the published ELMo weight layout (bilm-tf ``dump_weights`` / AllenNLP).

Each model parameter is stored exactly as the file stores it (TF orientation, TF gate order), so a
load followed by a save gives back the same bytes for every dataset.
"""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import torch

from storage.atomic import atomic_path
from elmo_core.bilm import BiLM
from elmo_core.errors import WeightsError

_LSTM_CELL = "RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell"  # d: 0 forward, 1 backward


def _read(f: h5py.File, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in f:
        raise WeightsError(f"{f.filename}: dataset '{name}' is missing (expected shape {shape})")
    ds = f[name]
    if not isinstance(ds, h5py.Dataset) or ds.dtype.kind not in "fiu":
        what = "a group" if not isinstance(ds, h5py.Dataset) else f"a dataset of {ds.dtype} values"
        raise WeightsError(f"{f.filename}: '{name}' is {what}, expected a dataset of numbers of shape {shape}; "
                           f"is this a bilm-tf weight file?")
    if tuple(ds.shape) != tuple(shape):
        raise WeightsError(
            f"{f.filename}: dataset '{name}' has shape {tuple(ds.shape)}, expected {tuple(shape)} "
            "from options.json; do the options belong to these weights?"
        )
    try:
        return np.asarray(ds[...], dtype=np.float32)
    except (OSError, RuntimeError) as e:
        raise WeightsError(f"{f.filename}: dataset '{name}' cannot be read ({e}); the file may be truncated") from None


def _copy(param: torch.Tensor, value: np.ndarray) -> None:
    with torch.no_grad():
        param.copy_(torch.from_numpy(np.ascontiguousarray(value)))


def _load_char_embed(f: h5py.File, model: BiLM) -> None:
    # The file has no row for id 0: ids are shifted by +1 and row 0 is the all-zero padding row.
    emb = model.encoder.char_embed
    value = _read(f, "char_embed", (emb.shape[0] - 1, emb.shape[1]))
    _copy(emb, np.concatenate([np.zeros((1, emb.shape[1]), np.float32), value]))


def _load_cnn(f: h5py.File, model: BiLM) -> None:
    # TF conv2d kernels are (1, width, char_dim, n_filters); torch Conv1d wants (n, char_dim, width).
    E = model.config.char_cnn.embedding_dim
    for i, (conv, (w, n)) in enumerate(zip(model.encoder.convs, model.config.char_cnn.filters)):
        _copy(conv.weight, _read(f, f"CNN/W_cnn_{i}", (1, w, E, n))[0].transpose(2, 1, 0))
        _copy(conv.bias, _read(f, f"CNN/b_cnn_{i}", (n,)))


def _load_highway(f: h5py.File, model: BiLM) -> None:
    # Kept in TF's convention (the gate multiplies the transform): no sign flip, unlike AllenNLP.
    hw, F = model.encoder.highway, model.config.char_cnn.n_filters
    for k in range(hw.n_layers):
        g = f"CNN_high_{k}"
        w = np.concatenate([_read(f, f"{g}/W_transform", (F, F)), _read(f, f"{g}/W_carry", (F, F))], axis=1)
        b = np.concatenate([_read(f, f"{g}/b_transform", (F,)), _read(f, f"{g}/b_carry", (F,))])
        _copy(hw.weight[k], w)
        _copy(hw.bias[k], b)


def _load_projection(f: h5py.File, model: BiLM) -> None:
    enc = model.encoder
    _copy(enc.proj_weight, _read(f, "CNN_proj/W_proj", tuple(enc.proj_weight.shape)))
    _copy(enc.proj_bias, _read(f, "CNN_proj/b_proj", tuple(enc.proj_bias.shape)))


def _load_lstm(f: h5py.File, model: BiLM) -> None:
    # W_0 is [W_x; W_h] stacked on the input axis, columns in TF gate order i, j, f, o. B is the
    # bias as stored: TF's LSTMCell adds forget_bias=1.0 at run time, and so does BiLstmStack.
    lstm, cfg = model.lstm, model.config.lstm
    P, C = cfg.projection_dim, cfg.dim
    for layer in range(cfg.n_layers):
        for d in range(2):
            cell = _LSTM_CELL.format(d=d, l=layer)
            w0 = _read(f, f"{cell}/W_0", (2 * P, 4 * C))
            _copy(lstm.w_input[layer, d], w0[:P])
            _copy(lstm.w_state[layer, d], w0[P:])
            _copy(lstm.bias[layer, d], _read(f, f"{cell}/B", (4 * C,)))
            _copy(lstm.w_proj[layer, d], _read(f, f"{cell}/W_P_0", (C, P)))


def open_weights_hdf5(path: Path) -> h5py.File:
    """``path`` open for reading; WeightsError naming it where it is no readable HDF5 file."""
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise WeightsError(f"{path}: not a readable HDF5 file ({e}); is it truncated or of another format?") from None


def load_hdf5_weights(model: BiLM, path: str | Path) -> None:
    """Fill ``model`` from a published ELMo weights file; errors name the dataset and shapes."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: weights file not found")
    with open_weights_hdf5(path) as f:
        for load in (_load_char_embed, _load_cnn, _load_highway, _load_projection, _load_lstm):
            load(f, model)
        _check_all_used(f, model)


def _check_all_used(f: h5py.File, model: BiLM) -> None:
    # Strict: a dataset the options do not use (a layer or highway more than the options say)
    # means the options do not describe these weights, even though every dataset they name fits.
    stored: list[str] = []
    f.visititems(lambda name, obj: stored.append(name) if isinstance(obj, h5py.Dataset) else None)
    unused = sorted(set(stored) - set(_tensors_for_hdf5(model)))
    if unused:
        cfg = model.config
        raise WeightsError(
            f"{f.filename}: datasets {unused[:6]}{' ...' if len(unused) > 6 else ''} are not used by options.json "
            f"({cfg.lstm.n_layers} LSTM layers, {cfg.char_cnn.n_highway} highway layers, "
            f"{len(cfg.char_cnn.filters)} filters); do the options belong to these weights?")


def _tensors_for_hdf5(model: BiLM) -> dict[str, np.ndarray]:
    """The inverse of the loaders above: dataset name -> array, in the published layout."""
    enc, lstm, cfg = model.encoder, model.lstm, model.config
    t = lambda x: x.detach().cpu().numpy()  # noqa: E731
    out = {"char_embed": t(enc.char_embed)[1:]}
    for i, conv in enumerate(enc.convs):
        out[f"CNN/W_cnn_{i}"] = t(conv.weight).transpose(2, 1, 0)[None]
        out[f"CNN/b_cnn_{i}"] = t(conv.bias)
    F = cfg.char_cnn.n_filters
    for k in range(enc.highway.n_layers):
        w, b = t(enc.highway.weight[k]), t(enc.highway.bias[k])
        out.update({f"CNN_high_{k}/W_transform": w[:, :F], f"CNN_high_{k}/W_carry": w[:, F:],
                    f"CNN_high_{k}/b_transform": b[:F], f"CNN_high_{k}/b_carry": b[F:]})
    out["CNN_proj/W_proj"], out["CNN_proj/b_proj"] = t(enc.proj_weight), t(enc.proj_bias)
    for layer in range(cfg.lstm.n_layers):
        for d in range(2):
            cell = _LSTM_CELL.format(d=d, l=layer)
            out[f"{cell}/W_0"] = np.concatenate([t(lstm.w_input[layer, d]), t(lstm.w_state[layer, d])])
            out[f"{cell}/B"] = t(lstm.bias[layer, d])
            out[f"{cell}/W_P_0"] = t(lstm.w_proj[layer, d])
    return out


def save_hdf5_weights(model: BiLM, path: str | Path) -> None:
    """Write ``model`` in the published layout."""
    path = Path(path)
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for name, value in _tensors_for_hdf5(model).items():
            f.create_dataset(name, data=np.ascontiguousarray(value, dtype=np.float32))
