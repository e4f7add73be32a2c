"""The single source of architecture truth: a frozen config read from and written to options.json.

The keys are those of the published ELMo ``options.json`` (bilm-tf / AllenNLP). Unknown keys and
values of the wrong type are errors; absent optional keys take the original's defaults.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .bounds import check_flags
from .errors import ConfigError, SettingError

ACTIVATIONS = ("relu", "tanh")


@dataclass(frozen=True)
class CharCnnConfig:
    """The character CNN token encoder (``char_cnn`` in options.json)."""

    embedding_dim: int = 16  # char_cnn.embedding.dim
    filters: tuple[tuple[int, int], ...] = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))
    n_highway: int = 2
    n_characters: int = 262  # 261 ids + the all-zero padding row (bilm-tf trains with 261)
    max_characters_per_token: int = 50
    activation: str = "relu"

    @property
    def n_filters(self) -> int:
        return sum(n for _, n in self.filters)


@dataclass(frozen=True)
class LstmConfig:
    """The stacked bidirectional LSTM with projection (``lstm`` in options.json)."""

    dim: int = 4096  # cell size C
    projection_dim: int = 512  # hidden/projection size P (also the token representation size)
    n_layers: int = 2
    cell_clip: float | None = 3.0  # None or 0: no clipping
    proj_clip: float | None = 3.0
    use_skip_connections: bool = True

    def __post_init__(self) -> None:
        _check_flags(self, "lstm.")

    @property
    def recurrent_weights(self) -> int:
        """Weights of one direction's recurrent matrix W_h (P x 4C): what the CPU's choices of
        products and layouts are sized by (``fast_lstm.PACKED_MIN_WEIGHTS``, ``layout.MEASURED_MIN_WEIGHTS``)."""
        return self.projection_dim * 4 * self.dim


@dataclass(frozen=True)
class TrainingConfig:
    """Training-only keys bilm-tf writes beside the architecture; ignored at inference."""

    bidirectional: bool = True
    dropout: float = 0.1
    all_clip_norm_val: float = 10.0
    n_epochs: int = 10
    n_train_tokens: int | None = None
    batch_size: int = 128
    n_tokens_vocab: int | None = None
    unroll_steps: int = 20
    n_negative_samples_batch: int = 8192

    def __post_init__(self) -> None:
        _check_flags(self, "")  # its keys sit at options.json's top level


@dataclass(frozen=True)
class DictionaryConfig:
    """Token ids from dictionaries instead of UTF-8 bytes, as ELMoForManyLangs models take them
    (``dictionaries`` in options.json, our extension; see ``elmo_core.dictionaries``).

    ``chars`` / ``words``: dictionary files beside options.json (``token\tid`` lines). With
    ``words``, each token also has a word embedding (``word_dim`` wide, ``n_words`` ids) placed
    before the char-CNN's output in the projection's input.
    """

    chars: str = "char.dic"
    words: str | None = None
    word_dim: int = 0
    n_words: int = 0


@dataclass(frozen=True)
class ElmoConfig:
    """A whole biLM architecture.

    Shape: a token's representation is ``projection_dim`` (P) wide; the biLM returns L+1 layers
    of width 2P, layer 0 being the token representation duplicated ``[x; x]``.
    """

    char_cnn: CharCnnConfig = field(default_factory=CharCnnConfig)
    lstm: LstmConfig = field(default_factory=LstmConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    dictionaries: DictionaryConfig | None = None

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def token_width(self) -> int:
        """Ids per token: its characters, then its word id where the model has word embeddings."""
        d = self.dictionaries
        return self.char_cnn.max_characters_per_token + (1 if d is not None and d.words else 0)

    @property
    def char_rows(self) -> int:
        """Rows of the char embedding, row 0 the all-zero padding row."""
        return self.char_cnn.n_characters if self.dictionaries is not None else 262

    @property
    def output_dim(self) -> int:
        return 2 * self.lstm.projection_dim

    @property
    def n_output_layers(self) -> int:
        return self.lstm.n_layers + 1

    @property
    def flops_per_token(self) -> float:
        """Multiply-adds x 2 for one real token: the char-CNN once (every position of the 50), the
        highway and projection, both directions of every LSTM layer. Full size: 204 MFLOP."""
        cc, ls = self.char_cnn, self.lstm
        conv = sum(2 * cc.embedding_dim * w * n * (cc.max_characters_per_token - w + 1) for w, n in cc.filters)
        F, P, C = cc.n_filters, ls.projection_dim, ls.dim
        highway = cc.n_highway * 2 * F * 2 * F
        lstm = ls.n_layers * 2 * 2 * (2 * P * 4 * C + C * P)
        return conv + highway + 2 * F * P + lstm

    # ---- options.json ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, options: dict[str, Any], source: str = "options") -> "ElmoConfig":
        return _from_options(options, source)

    @classmethod
    def from_json(cls, path: str | Path) -> "ElmoConfig":
        path = Path(path)
        try:
            options = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: options file not found") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text ({e}); options.json is UTF-8 JSON") from None
        except RecursionError:
            raise ConfigError(f"{path}: nested too deeply to be an options.json (an object of a few levels)") from None
        except ValueError as e:  # JSONDecodeError, or an integer of more digits than Python converts
            raise ConfigError(f"{path}: not valid JSON ({str(e)[:200]})") from None
        return _from_options(options, str(path))

    def to_dict(self) -> dict[str, Any]:
        cc, ls = self.char_cnn, self.lstm
        out: dict[str, Any] = {
            "lstm": {
                "dim": ls.dim,
                "projection_dim": ls.projection_dim,
                "n_layers": ls.n_layers,
                "cell_clip": ls.cell_clip if ls.cell_clip is not None else 0,
                "proj_clip": ls.proj_clip if ls.proj_clip is not None else 0,
                "use_skip_connections": ls.use_skip_connections,
            },
            "char_cnn": {
                "embedding": {"dim": cc.embedding_dim},
                "filters": [list(f) for f in cc.filters],
                "n_highway": cc.n_highway,
                "n_characters": cc.n_characters,
                "max_characters_per_token": cc.max_characters_per_token,
                "activation": cc.activation,
            },
        }
        if self.dictionaries is not None:
            out["dictionaries"] = {k: v for k, v in asdict(self.dictionaries).items() if v is not None}
        # bilm-tf writes its training keys beside the architecture; AllenNLP ignores them.
        out.update({k: v for k, v in asdict(self.training).items() if v is not None})
        return out

    def with_training(self, **kw: Any) -> "ElmoConfig":
        return replace(self, training=replace(self.training, **kw))


# ---- parsing ----------------------------------------------------------------------------------
_LSTM_KEYS = {f.name for f in fields(LstmConfig)}
_CHAR_KEYS = {"embedding", "filters", "n_highway", "n_characters", "max_characters_per_token", "activation"}
_TRAIN_KEYS = {f.name for f in fields(TrainingConfig)}


def _check_type(value: Any, types: tuple[type, ...], where: str) -> Any:
    if isinstance(value, bool) and bool not in types:
        raise ConfigError(f"{where}: expected {'/'.join(t.__name__ for t in types)}, got {value!r}")
    if not isinstance(value, types):
        raise ConfigError(f"{where}: expected {'/'.join(t.__name__ for t in types)}, got {value!r}")
    return value


def _check_flags(record: object, section: str) -> None:
    """Each bool field of ``record`` true or false (``bounds.check_flags``), else a ConfigError naming
    it as options.json does (``section`` before its name) with the value."""
    try:
        check_flags(record)
    except SettingError as e:
        raise ConfigError(e.spelled(lambda name: f"{section}{name}")) from None


def _made(cls: type, kw: dict[str, Any], source: str) -> Any:
    """``cls(**kw)``, its own refusal named with the file the values came from."""
    try:
        return cls(**kw)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def _unknown(keys: set[str], allowed: set[str], where: str) -> None:
    extra = sorted(keys - allowed)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {extra}; allowed: {sorted(allowed)}")


def _clip(value: Any, where: str) -> float | None:
    if value is None:
        return None
    _check_type(value, (int, float), where)
    if not math.isfinite(value):
        raise ConfigError(f"{where}: must be a finite number (0 or null: no clipping), got {value!r}")
    return float(value) if value > 0 else None


def _parse_lstm(d: Any, source: str) -> LstmConfig:
    where = f"{source}: lstm"
    _check_type(d, (dict,), where)
    _unknown(set(d), _LSTM_KEYS, where)
    kw: dict[str, Any] = {}
    for k in ("dim", "projection_dim", "n_layers"):
        if k in d:
            kw[k] = _check_type(d[k], (int,), f"{where}.{k}")
    for k in ("cell_clip", "proj_clip"):
        if k in d:
            kw[k] = _clip(d[k], f"{where}.{k}")
    if "use_skip_connections" in d:
        kw["use_skip_connections"] = d["use_skip_connections"]  # checked as the record is made
    if "projection_dim" not in kw and "dim" in kw:
        kw["projection_dim"] = kw["dim"]  # bilm-tf: no projection when projection_dim is absent
    return _made(LstmConfig, kw, source)


def _parse_filters(value: Any, where: str) -> tuple[tuple[int, int], ...]:
    _check_type(value, (list, tuple), where)
    out = []
    for i, f in enumerate(value):
        if not (isinstance(f, (list, tuple)) and len(f) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in f)):
            raise ConfigError(f"{where}[{i}]: expected [width, n_filters] integers, got {f!r}")
        out.append((int(f[0]), int(f[1])))
    return tuple(out)


def _parse_char_cnn(d: Any, where: str) -> CharCnnConfig:
    _check_type(d, (dict,), where)
    _unknown(set(d), _CHAR_KEYS, where)
    kw: dict[str, Any] = {}
    if "embedding" in d:
        emb = _check_type(d["embedding"], (dict,), f"{where}.embedding")
        _unknown(set(emb), {"dim"}, f"{where}.embedding")
        if "dim" in emb:
            kw["embedding_dim"] = _check_type(emb["dim"], (int,), f"{where}.embedding.dim")
    if "filters" in d:
        kw["filters"] = _parse_filters(d["filters"], f"{where}.filters")
    for k in ("n_highway", "n_characters", "max_characters_per_token"):
        if k in d:
            kw[k] = _check_type(d[k], (int,), f"{where}.{k}")
    if "activation" in d:
        kw["activation"] = _check_type(d["activation"], (str,), f"{where}.activation")
    return CharCnnConfig(**kw)


def _parse_training(d: dict[str, Any], source: str) -> TrainingConfig:
    kw: dict[str, Any] = {}
    types: dict[str, tuple[type, ...]] = {
        "dropout": (int, float), "all_clip_norm_val": (int, float),
        "n_epochs": (int,), "n_train_tokens": (int, type(None)), "batch_size": (int,),
        "n_tokens_vocab": (int, type(None)), "unroll_steps": (int,), "n_negative_samples_batch": (int,),
    }  # bidirectional's, a bool's, is checked as the record is made
    for k in _TRAIN_KEYS & set(d):
        kw[k] = _check_type(d[k], types[k], f"{source}.{k}") if k in types else d[k]
        if k in ("dropout", "all_clip_norm_val"):
            if not math.isfinite(kw[k]):
                raise ConfigError(f"{source}.{k}: must be a finite number, got {kw[k]!r}")
            kw[k] = float(kw[k])
    return _made(TrainingConfig, kw, source)


def _from_options(options: Any, source: str) -> ElmoConfig:
    _check_type(options, (dict,), source)
    _unknown(set(options), {"lstm", "char_cnn", "dictionaries"} | _TRAIN_KEYS, source)
    if "char_cnn" not in options:
        raise ConfigError(f"{source}: no 'char_cnn' section; only character-based ELMo models are supported")
    if "lstm" not in options:
        raise ConfigError(f"{source}: no 'lstm' section")
    parts = dict(char_cnn=_parse_char_cnn(options["char_cnn"], f"{source}: char_cnn"),
                 lstm=_parse_lstm(options["lstm"], source), training=_parse_training(options, source),
                 dictionaries=_parse_dictionaries(options["dictionaries"], f"{source}: dictionaries")
                 if "dictionaries" in options else None)
    return _made(ElmoConfig, parts, source)  # a value out of range: named with the file it came from


def _parse_dictionaries(d: Any, where: str) -> DictionaryConfig:
    _check_type(d, (dict,), where)
    _unknown(set(d), {f.name for f in fields(DictionaryConfig)}, where)
    kw: dict[str, Any] = {}
    for k in ("chars", "words"):
        if k in d:
            kw[k] = _check_type(d[k], (str,), f"{where}.{k}")
            if kw[k] in ("", ".", "..") or "/" in kw[k] or "\\" in kw[k] or "\0" in kw[k]:  # copied beside every export
                raise ConfigError(f"{where}.{k}: {kw[k]!r} must be a file name beside options.json (no directory "
                                  f"part): an export copies it under that name")
    for k in ("word_dim", "n_words"):
        if k in d:
            kw[k] = _check_type(d[k], (int,), f"{where}.{k}")
    return DictionaryConfig(**kw)


# ---- validation -------------------------------------------------------------------------------
MAX_INT = 2**31 - 1  # any count in options.json (epochs, tokens, vocabulary)
MAX_WIDTH = 65536  # a layer's width: lstm.dim, projection_dim, embedding dims, filters per width
MAX_PARAMETERS = 2**31  # 8 GiB of float32: the model is allocated whole when it loads
# The other counts, each far above every published model's (full size: 2 layers, 50 characters).
LIMITS = {"lstm.dim": MAX_WIDTH, "lstm.projection_dim": MAX_WIDTH, "lstm.n_layers": 64,
          "char_cnn.embedding.dim": MAX_WIDTH, "char_cnn.n_highway": 64, "char_cnn.max_characters_per_token": 1024,
          "char_cnn.n_characters": 2**24, "char_cnn.filters": 64, "char_cnn.filters n_filters": MAX_WIDTH,
          "dictionaries.word_dim": MAX_WIDTH, "dictionaries.n_words": 2**27, "training.n_train_tokens": 2**62}


def _positive(value: int, where: str) -> None:
    if value <= 0:
        raise ConfigError(f"{where} must be positive, got {value}")


def _at_most(value: int, where: str) -> None:
    limit = LIMITS.get(where, MAX_INT)
    if value > limit:
        raise ConfigError(f"{where} is {value}, over the limit of {limit:,}: not an ELMo model this program "
                          f"can allocate (check the value)")


def parameter_count(cfg: "ElmoConfig") -> int:
    """The model's weights, counted before any is allocated: char and word embeddings, the
    convolutions, highway and projection, both directions of every LSTM layer."""
    cc, ls, d = cfg.char_cnn, cfg.lstm, cfg.dictionaries
    F, P, C = cc.n_filters, ls.projection_dim, ls.dim
    words = d.n_words * d.word_dim if d is not None else 0
    encoder = cfg.char_rows * cc.embedding_dim + sum(cc.embedding_dim * w * n + n for w, n in cc.filters)
    encoder += cc.n_highway * (2 * F * F + 2 * F) + (F + (d.word_dim if d is not None else 0)) * P + P
    return words + encoder + ls.n_layers * 2 * (P * 4 * C + P * 4 * C + 4 * C + C * P)


def _check_sizes(cfg: "ElmoConfig") -> None:
    """Every count within its limit, then the product that is allocated: the weights."""
    cc, ls, d = cfg.char_cnn, cfg.lstm, cfg.dictionaries
    values = {"lstm.dim": ls.dim, "lstm.projection_dim": ls.projection_dim, "lstm.n_layers": ls.n_layers,
              "char_cnn.embedding.dim": cc.embedding_dim, "char_cnn.n_highway": cc.n_highway,
              "char_cnn.max_characters_per_token": cc.max_characters_per_token,
              "char_cnn.n_characters": cc.n_characters, "char_cnn.filters": len(cc.filters),
              **{f"training.{f.name}": getattr(cfg.training, f.name) for f in fields(TrainingConfig)
                 if isinstance(getattr(cfg.training, f.name), int)}}
    if d is not None:
        values |= {"dictionaries.word_dim": d.word_dim, "dictionaries.n_words": d.n_words}
    for where, value in values.items():
        _at_most(value, where)
    for _, n in cc.filters:
        _at_most(n, "char_cnn.filters n_filters")
    n = parameter_count(cfg)
    if n > MAX_PARAMETERS:
        raise ConfigError(f"the options describe {n:,} weights (lstm.dim {ls.dim} x lstm.projection_dim "
                          f"{ls.projection_dim} x lstm.n_layers {ls.n_layers}, the char-CNN's filters), over the "
                          f"limit of {MAX_PARAMETERS:,} (8 GiB of float32): check lstm.dim and the other sizes")


def _validate(cfg: ElmoConfig) -> None:
    cc, ls, tr = cfg.char_cnn, cfg.lstm, cfg.training
    for k in ("cell_clip", "proj_clip"):
        clip = getattr(ls, k)
        if clip is not None and not (math.isfinite(clip) and clip >= 0):
            raise ConfigError(f"lstm.{k} must be a finite number >= 0 (0 or null: no clipping), got {clip}")
    _positive(cc.embedding_dim, "char_cnn.embedding.dim")
    if not cc.filters:
        raise ConfigError("char_cnn.filters must list at least one [width, n_filters]")
    for w, n in cc.filters:
        _positive(w, "char_cnn.filters width")
        _positive(n, "char_cnn.filters n_filters")
        if w > cc.max_characters_per_token:
            raise ConfigError(f"char_cnn.filters width {w} exceeds max_characters_per_token {cc.max_characters_per_token}")
    if cc.n_highway < 0:
        raise ConfigError(f"char_cnn.n_highway must be >= 0, got {cc.n_highway}")
    if cfg.dictionaries is not None:
        _validate_dictionaries(cfg.dictionaries, cc)
    elif cc.n_characters not in (261, 262):
        raise ConfigError(f"char_cnn.n_characters must be 262 (or 261 as bilm-tf trains), got {cc.n_characters}")
    if cc.max_characters_per_token < 3:
        raise ConfigError(f"char_cnn.max_characters_per_token must be >= 3, got {cc.max_characters_per_token}")
    if cc.activation not in ACTIVATIONS:
        raise ConfigError(f"char_cnn.activation must be one of {ACTIVATIONS}, got {cc.activation!r}")
    for k in ("dim", "projection_dim", "n_layers"):
        _positive(getattr(ls, k), f"lstm.{k}")
    if not tr.bidirectional:
        raise ConfigError("bidirectional: false is not supported; ELMo is a biLM")
    if not 0.0 <= tr.dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {tr.dropout}")
    _check_sizes(cfg)


def _validate_dictionaries(d: DictionaryConfig, cc: CharCnnConfig) -> None:
    if cc.n_characters < 8:
        raise ConfigError(f"char_cnn.n_characters must be at least 8 (the padding row and 7 markers), got {cc.n_characters}")
    if cc.max_characters_per_token < 7:
        raise ConfigError(f"char_cnn.max_characters_per_token must be >= 7 with dictionaries (a boundary token "
                          f"'<bos>' is 5 characters plus two markers), got {cc.max_characters_per_token}")
    if (d.words is None) != (d.word_dim == 0) or (d.words is None) != (d.n_words == 0):
        raise ConfigError(f"dictionaries: words, word_dim and n_words go together (a word embedding input), "
                          f"got words={d.words!r}, word_dim={d.word_dim}, n_words={d.n_words}")
