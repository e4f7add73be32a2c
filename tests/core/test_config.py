from __future__ import annotations

import json

import pytest

from elmo_core import ConfigError, ElmoConfig

from tests.helpers import TINY_OPTIONS


def test_published_options_round_trip(fixture_dir, tmp_path):
    cfg = ElmoConfig.from_json(fixture_dir / "options.json")
    assert cfg.lstm.dim == 64 and cfg.lstm.projection_dim == 16 and cfg.char_cnn.filters[-1] == (5, 64)
    assert cfg.lstm.cell_clip == 3.0 and cfg.char_cnn.n_highway == 2 and cfg.output_dim == 32
    (tmp_path / "o.json").write_text(json.dumps(cfg.to_dict()))
    assert ElmoConfig.from_json(tmp_path / "o.json") == cfg


def test_defaults_are_the_originals():
    cfg = ElmoConfig.from_dict({"lstm": {"dim": 8, "projection_dim": 4}, "char_cnn": {"filters": [[1, 2]]}})
    assert cfg.char_cnn.activation == "relu" and cfg.char_cnn.max_characters_per_token == 50
    assert cfg.lstm.n_layers == 2 and cfg.lstm.use_skip_connections is True
    assert cfg.training.n_negative_samples_batch == 8192 and cfg.training.dropout == 0.1


def test_zero_clip_means_no_clipping():
    cfg = ElmoConfig.from_dict({"lstm": {"dim": 8, "projection_dim": 4, "cell_clip": 0}, "char_cnn": {}})
    assert cfg.lstm.cell_clip is None


def test_training_keys_are_accepted_and_written(tmp_path):
    opts = {**TINY_OPTIONS, "n_tokens_vocab": 100, "dropout": 0.2, "unroll_steps": 10}
    cfg = ElmoConfig.from_dict(opts)
    assert cfg.training.n_tokens_vocab == 100 and cfg.training.dropout == 0.2
    assert json.loads(json.dumps(cfg.to_dict()))["n_tokens_vocab"] == 100


@pytest.mark.parametrize("patch, message", [
    ({"lstm": {"dim": 8, "bogus": 1}}, r"unknown key\(s\) \['bogus'\]"),
    ({"typo_key": 1}, r"unknown key\(s\) \['typo_key'\]"),
    ({"lstm": {"dim": "8"}}, "lstm.dim: expected int"),
    ({"lstm": {"use_skip_connections": "yes"}}, "use_skip_connections: expected bool"),
    ({"char_cnn": {"activation": "gelu"}}, "activation must be one of"),
    ({"char_cnn": {"filters": [[1]]}}, r"filters\[0\]"),
    ({"char_cnn": {"filters": [[60, 4]]}}, "exceeds max_characters_per_token"),
    ({"lstm": {"n_layers": 0}}, "lstm.n_layers must be positive"),
    ({"lstm": {"dim": True}}, "lstm.dim: expected int"),
])
def test_invalid_options_are_clear_errors(patch, message):
    opts = json.loads(json.dumps(TINY_OPTIONS))
    for k, v in patch.items():
        if isinstance(v, dict) and k in opts:
            opts[k].update(v)
        else:
            opts[k] = v
    with pytest.raises(ConfigError, match=message):
        ElmoConfig.from_dict(opts)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        ElmoConfig.from_json(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ElmoConfig.from_json(tmp_path / "bad.json")


def test_config_is_frozen():
    cfg = ElmoConfig.from_dict(TINY_OPTIONS)
    with pytest.raises(AttributeError):
        cfg.lstm.dim = 3  # type: ignore[misc]
