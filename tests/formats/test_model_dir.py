from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
import torch

from elmo_core import WeightsError, batch_to_ids

from formats import load_bilm, save_model
from formats.model_dir import resolve_model

from tests.helpers import SENTENCES, tiny_options


def _datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[...]) if isinstance(o, h5py.Dataset) else None)
    return out


def test_hdf5_round_trip_is_bit_exact(fixture_dir, tmp_path):
    model = load_bilm(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5")
    save_model(model, tmp_path)
    original, written = _datasets(fixture_dir / "lm_weights.hdf5"), _datasets(tmp_path / "weights.hdf5")
    assert set(original) == set(written)
    for name in original:
        assert original[name].dtype == written[name].dtype, name
        assert original[name].tobytes() == written[name].tobytes(), name


def test_safetensors_round_trip(tiny_dir, tmp_path):
    model = load_bilm(tiny_dir)
    save_model(model, tmp_path / "native", fmt="safetensors")
    assert resolve_model(tmp_path / "native").format == "safetensors"
    again = load_bilm(tmp_path / "native")
    ids = torch.from_numpy(batch_to_ids(SENTENCES))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids)[0], again(ids)[0], atol=0, rtol=0)


def test_mismatched_options_name_dataset_and_shapes(tiny_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(tiny_dir / "weights.hdf5", other / "weights.hdf5")
    import json
    (other / "options.json").write_text(json.dumps(tiny_options(lstm__dim=32)))
    with pytest.raises(WeightsError, match=r"'RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0' has shape \(16, 96\), expected \(16, 128\)"):
        load_bilm(other)


@pytest.mark.parametrize("fewer, unused", [
    ({"lstm__n_layers": 1}, "RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/B"),
    ({"char_cnn__n_highway": 0}, "CNN_high_0/W_carry"),
])
def test_options_that_use_fewer_layers_than_the_file_are_refused(tiny_dir, tmp_path, fewer, unused):
    """Options naming fewer layers fit every dataset they read; the datasets left over are the error."""
    import json

    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(tiny_dir / "weights.hdf5", other / "weights.hdf5")
    (other / "options.json").write_text(json.dumps(tiny_options(**fewer)))
    with pytest.raises(WeightsError, match=rf"datasets \['{unused}'.* are not used by options.json"):
        load_bilm(other)


def test_missing_dataset(tiny_dir):
    with h5py.File(tiny_dir / "weights.hdf5", "a") as f:
        del f["CNN_proj/b_proj"]
    with pytest.raises(WeightsError, match="'CNN_proj/b_proj' is missing"):
        load_bilm(tiny_dir)


@pytest.mark.parametrize("replace, says", [
    (lambda f, name: f.create_group(name), "is a group"),
    (lambda f, name: f.create_dataset(name, data=np.array([b"x"] * 4, dtype="S3")), r"is a dataset of \|S3 values"),
    (lambda f, name: f.create_dataset(name, data=np.zeros(4, dtype=[("a", "f4"), ("b", "i4")])), r"is a dataset of \[\('a'"),
])
def test_a_weight_that_is_not_an_array_of_numbers_is_a_weights_error(tiny_dir, replace, says):
    """A group, strings or a compound type where a weight matrix belongs: named, not an
    AttributeError / ValueError / TypeError from h5py or numpy."""
    name = "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0"
    with h5py.File(tiny_dir / "weights.hdf5", "a") as f:
        del f[name]
        replace(f, name)
    with pytest.raises(WeightsError, match=rf"'{name}' {says}.*expected a dataset of numbers"):
        load_bilm(tiny_dir)


def test_a_directory_with_a_broken_export_manifest_says_so(tmp_path):
    """Not "no options.json": the directory is an export whose manifest cannot be read."""
    from formats.model_files import resolve_model

    (tmp_path / "manifest.json").write_text("{")
    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(WeightsError, match=r"holds a manifest.json that is not an export's .*elmo info --model"):
        resolve_model(tmp_path)


def test_an_export_given_where_its_model_directory_is_loaded_is_named_an_export(tmp_path):
    """It was called a directory whose manifest is not an export's (`elmo info` says it is one)."""
    from formats.model_files import resolve_model

    (tmp_path / "manifest.json").write_text('{"kind": "onnx"}')
    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(WeightsError, match=r"an onnx export, not a model directory; .* the directory the export was"):
        resolve_model(tmp_path)


def test_truncated_file(tiny_dir):
    path = tiny_dir / "weights.hdf5"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match="weights.hdf5"):
        load_bilm(tiny_dir)


def test_not_hdf5_and_missing_files(tmp_path, tiny_dir):
    (tiny_dir / "weights.hdf5").write_text("hello")
    with pytest.raises(WeightsError, match="not a readable HDF5 file"):
        load_bilm(tiny_dir)
    with pytest.raises(WeightsError, match="not a model directory"):
        load_bilm(tmp_path / "nowhere")
    with pytest.raises(WeightsError, match="weights file not found"):
        load_bilm(tiny_dir / "options.json", tmp_path / "missing.hdf5")


def test_corrupt_safetensors(tiny_dir, tmp_path):
    save_model(load_bilm(tiny_dir), tmp_path / "n", fmt="safetensors")
    (tmp_path / "n" / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(WeightsError, match="cannot read safetensors"):
        load_bilm(tmp_path / "n")


def test_padding_row_written_without_it(tiny_dir):
    emb = _datasets(tiny_dir / "weights.hdf5")["char_embed"]
    assert emb.shape == (261, 4)
    model = load_bilm(tiny_dir)
    assert not model.encoder.char_embed[0].any()
    np.testing.assert_array_equal(model.encoder.char_embed[1:].detach().numpy(), emb)


def test_a_directory_of_published_file_names(tiny_dir, tmp_path):
    """The published files side by side: *_options.json, *_weights.hdf5 and *_softmax_weights.hdf5."""
    d = tmp_path / "published"
    d.mkdir()
    shutil.copy(tiny_dir / "options.json", d / "elmo_tiny_options.json")
    shutil.copy(tiny_dir / "weights.hdf5", d / "elmo_tiny_weights.hdf5")
    with h5py.File(d / "elmo_tiny_softmax_weights.hdf5", "w") as f:
        f.create_dataset("softmax/W", data=np.zeros((5, 8), np.float32))
    files = resolve_model(d)
    assert (files.options.name, files.weights.name) == ("elmo_tiny_options.json", "elmo_tiny_weights.hdf5")
    assert load_bilm(d).config.lstm.dim == 24
    shutil.copy(tiny_dir / "weights.hdf5", d / "elmo_tiny_weights_v2.hdf5")
    with pytest.raises(WeightsError, match="name the file with --weights"):
        resolve_model(d)
    assert resolve_model(d, d / "elmo_tiny_weights_v2.hdf5").weights.name == "elmo_tiny_weights_v2.hdf5"
    with pytest.raises(WeightsError, match="needs its weights file too"):
        resolve_model(d / "elmo_tiny_options.json")
