"""``elmo_core/config.py``: options.json read, checked and written. Hostile files (issue #47):
nesting, invalid UTF-8, huge integers, sizes no machine allocates, NaN clips; each is a ConfigError
naming the file and field (exit 2 from every command), found before anything is allocated. A
hypothesis pass mutates a valid file at random."""
from __future__ import annotations

import copy
import json
import math
import shutil
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elmo_cli.main import main
from elmo_core import ConfigError, ElmoConfig
from elmo_core.config import MAX_PARAMETERS, LstmConfig, TrainingConfig, parameter_count
from tests.helpers import TINY_OPTIONS, tiny_options


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
    ({"lstm": {"use_skip_connections": "yes"}}, "lstm.use_skip_connections must be true or false, got str 'yes'"),
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


BOOLS = [("lstm", "use_skip_connections", "false", "str 'false'"), ("lstm", "use_skip_connections", 1, "int 1"),
         (None, "bidirectional", "true", "str 'true'"), (None, "bidirectional", None, "NoneType None")]


@pytest.mark.parametrize("section, key, value, shown", BOOLS)
def test_a_bool_that_is_not_true_or_false_is_refused_naming_the_field_and_value(section, key, value, shown):
    """Read from options.json ("false" would read as true) and made directly, as efml's converter and
    a library caller make the records: the records' own check (``bounds.check_flags``) refuses both."""
    name = f"{section}.{key}" if section else key
    opts = copy.deepcopy(TINY_OPTIONS)
    (opts[section] if section else opts)[key] = value
    with pytest.raises(ConfigError) as e:
        ElmoConfig.from_dict(opts, "m/options.json")
    assert str(e.value) == f"m/options.json: {name} must be true or false, got {shown}"
    record = LstmConfig if section == "lstm" else TrainingConfig
    with pytest.raises(ConfigError) as e:
        ElmoConfig(**{section or "training": record(**{key: value})})
    assert str(e.value) == f"{name} must be true or false, got {shown}"


def test_a_numpy_bool_is_kept_as_pythons():
    assert LstmConfig(use_skip_connections=np.bool_(False)).use_skip_connections is False


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


HOSTILE = {
    "nested 200,000 deep": (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
    "invalid UTF-8": (b'{"lstm": {"dim": 8}, "char_cnn": "\xff\xfe"}', "not UTF-8 text"),
    "a 5,000-digit integer": (b'{"lstm": {"dim": ' + b"9" * 5000 + b"}}", "not valid JSON"),
    "lstm.dim 2**40": (json.dumps(tiny_options(lstm__dim=2**40)).encode(), "lstm.dim is 1099511627776, over the limit"),
    "max_characters_per_token 1e9": (json.dumps(tiny_options(char_cnn__max_characters_per_token=10**9)).encode(),
                                     "char_cnn.max_characters_per_token is 1000000000, over the limit of 1,024"),
    "cell_clip NaN": (json.dumps(tiny_options(lstm__cell_clip=float("nan"))).encode(), "lstm.cell_clip: must be a finite"),
    "proj_clip Infinity": (json.dumps(tiny_options(lstm__proj_clip=float("inf"))).encode(), "lstm.proj_clip: must be"),
    "weights over 8 GiB": (json.dumps(tiny_options(lstm__dim=40000, lstm__projection_dim=40000)).encode(),
                           "weights (lstm.dim 40000 x lstm.projection_dim 40000"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_options_file_is_a_config_error_naming_the_field(tmp_path, name):
    data, message = HOSTILE[name]
    path = tmp_path / "options.json"
    path.write_bytes(data)
    started = time.thread_time()  # this thread's CPU time: the work done, whatever else the machine runs
    with pytest.raises(ConfigError) as e:
        ElmoConfig.from_json(path)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)
    assert time.thread_time() - started < 1.0  # found before anything is allocated


@pytest.mark.parametrize("name", ["nested 200,000 deep", "lstm.dim 2**40", "cell_clip NaN"])
def test_every_command_exits_2_on_a_hostile_options_file(tiny_dir, tmp_path, capsys, name):
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    (model / "options.json").write_bytes(HOSTILE[name][0])
    (tmp_path / "in.txt").write_text("The cat sat .\n")
    for argv in (["info", "--model", model], ["embed", "--text", tmp_path / "in.txt", "--out", tmp_path / "o.hdf5", "--format", "hdf5", "--model",
                                   model], ["serve", "--model", model, "--port", "0"]):
        assert main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert HOSTILE[name][1] in err and "Traceback" not in err, err


def test_the_published_sizes_are_within_the_limits():
    assert parameter_count(ElmoConfig()) == 93_600_864  # the published full size: 93.6M
    assert parameter_count(ElmoConfig.from_dict(TINY_OPTIONS)) < MAX_PARAMETERS


JSON = st.recursive(st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
                    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
PATHS = [("lstm", k) for k in TINY_OPTIONS["lstm"]] + [("char_cnn", k) for k in TINY_OPTIONS["char_cnn"]] + \
    [("char_cnn", "embedding", "dim"), ("char_cnn", "filters", 0), ("char_cnn", "filters", 1, 1), ("dropout",),
     ("n_tokens_vocab",), ("dictionaries",), ("lstm",), ("char_cnn",)]


def _mutated(options: dict, path: tuple, value: object) -> dict:
    out = copy.deepcopy(options)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=JSON | st.integers(min_value=2**20, max_value=2**64))
def test_fuzz_a_mutated_options_file_is_valid_or_a_config_error(tmp_path, path, value):
    file = tmp_path / "options.json"
    file.write_text(json.dumps(_mutated(TINY_OPTIONS, path, value)))
    try:
        config = ElmoConfig.from_json(file)
    except ConfigError as e:
        assert str(e).startswith(str(file))
        return
    assert parameter_count(config) <= MAX_PARAMETERS
    assert all(math.isfinite(c) for c in (config.lstm.cell_clip or 0, config.lstm.proj_clip or 0))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=64) | JSON.map(lambda v: json.dumps(v).encode()))
def test_fuzz_any_bytes_as_options_file_are_a_config_error(tmp_path, data):
    file = tmp_path / "options.json"
    file.write_bytes(data)
    with pytest.raises(ConfigError):
        ElmoConfig.from_json(file)


def test_an_unreadable_options_path_is_a_config_error(tmp_path):
    (tmp_path / "options.json").mkdir()
    with pytest.raises(ConfigError, match="cannot be read"):
        ElmoConfig.from_json(tmp_path / "options.json")
