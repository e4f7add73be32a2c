"""The command line's vocabulary: one flag per meaning, the same in every subcommand.

``MEANINGS`` names each setting that more than one subcommand takes (the model, the batch budget,
the time budget, the precision, ...) once: its flag and its help.

Options dataclasses (``EmbedOptions``, ``TrainOptions``, ``ServeLimits``, ...) become flags through
``add_fields``: one flag per field, its help, group and choices from the field's metadata; a field
whose metadata names a ``meaning`` takes that meaning's flag and dest, so a
library's field name (``max_tokens_per_batch``) and the flag users type (``--max-batch-tokens``)
are tied here once. ``field_values`` reads the fields back from the parsed arguments, and
``flag_spelling`` names a field in an error by its command's flag. Only argparse's public API.

Scale-out: ``--replicas`` is the number of copies of the model Ray runs (embed: actors taking
shards; serve: Ray Serve replicas behind one address), each given ``--num-gpus-per-replica`` GPUs.
Triton's ``--instances``, ``--kind`` and ``--max-batch-size`` stay Triton's own terms (instances
inside one server's process, their kind, config.pbtxt's batch bound); its batcher's wait is
``--max-wait-ms``, as ``elmo serve``'s.

A flag a command does not take is refused (exit 2) with a note where one helps (``refusal_notes``):
an older spelling names its flag now (``RENAMED``; pre-1.0: no aliases), and ``REFUSED`` says why a
command lacks a flag others take, or took one that now means something else.
"""
from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING, Field, dataclass, fields
from typing import Any, Callable, Protocol


class Flags(Protocol):
    """Where flags are added: a parser or one of its argument groups."""

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action: ...


class Subcommands(Protocol):
    """What ``ArgumentParser.add_subparsers`` returns: where a command's parser is added."""

    choices: dict[str, argparse.ArgumentParser]  # the commands' parsers by name

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


@dataclass(frozen=True)
class Meaning:
    flag: str
    help: str
    switch: bool = False  # takes no value (store_true)
    path: bool = False  # a file, directory, glob or URI: never empty

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")


MEANINGS: dict[str, Meaning] = {m.dest: m for m in (
    Meaning("--text", "the text to read: a text (.gz) or Parquet file, a directory or a glob", path=True),
    Meaning("--out", "what the command writes: a directory, or the file it names", path=True),
    Meaning("--model", "model directory (options.json + weights), or an export directory", path=True),
    Meaning("--weights", "the weights file, when --model's directory holds several (or --model is an options.json)", path=True),
    Meaning("--backend", "what runs the model (default: the export's own for an export directory, its "
                         "manifest.json; else torch)"),
    Meaning("--device", "cpu, cuda or cuda:N: where the model runs"),
    Meaning("--threads", "the model's threads (default: the process's CPUs, see README's Threads)"),
    Meaning("--precision", "the precision the model multiplies in"),
    Meaning("--layout", "how the torch backend runs the recurrence: packed (eager steps), fused (compiled "
                        "steps), rows (static rows: CUDA graphs on CUDA, eager windows on a CPU); auto (default): "
                        "rows on CUDA, on a CPU the fastest of packed, fused and rows measured once for this CPU, "
                        "precision and model shape (inference/layout.py)"),
    Meaning("--max-batch-tokens", "padded tokens (sentences x longest sentence) per model batch"),
    Meaning("--max-sentence-tokens", "tokens one sentence may hold"),
    Meaning("--text-column", "the Parquet column of whitespace-tokenized text"),
    Meaning("--replicas", "copies of the model Ray runs, each loading it"),
    Meaning("--num-gpus-per-replica", "GPUs Ray gives each replica (a fraction shares one)"),
    Meaning("--ray-address", "an existing Ray cluster (default: start a local one)"),
    Meaning("--max-minutes", "training time in minutes, the final evaluation included"),
    Meaning("--eval-batch-size", "sentences scored a batch when perplexity is measured (elmo train's evaluations, "
                                 "elmo perplexity)"),
    Meaning("--max-wait-ms", "how long the oldest queued sentence waits for others to join its batch"),
    Meaning("--work-dir", "where the command keeps its corpus, runs and outputs", path=True),
    Meaning("--token-embeddings", "a token-embedding file (elmo dump-tokens): its words skip the char-CNN (torch "
                                  "backend; same vectors within 1e-5)", path=True),
    Meaning("--token-vocab", "the vocabulary of a --token-embeddings file that does not list its words (bilm-tf's "
                             "own files)", path=True),
    Meaning("--json", "print the result as JSON on stdout", switch=True),
    Meaning("--quiet", "no progress lines", switch=True),
)}


RENAMED: dict[str, str] = {  # an older spelling -> its flag now, in every command
    "--max-tokens-per-batch": "--max-batch-tokens", "--max-sentence-length": "--max-sentence-tokens",
    "--column": "--text-column", "--workers": "--replicas", "--num-gpus-per-worker": "--num-gpus-per-replica",
    "--minutes": "--max-minutes", "--train-minutes": "--max-minutes", "--work": "--work-dir",
    "--bf16": "--precision", "--no-bf16": "--precision", "--fp16": "--precision",
    "--train": "--text", "--data": "--text", "--input": "--text", "--corpus": "--text",
    "--output-dir": "--out", "--out-dir": "--out", "--dest": "--out", "--onnx": "--model",
}
_ON_THE_CPU = ("against the torch backend in fp32 on the CPU, the reference every export's parity is held to "
               "(docs/export.md)")
REFUSED: dict[str, dict[str, str]] = {  # command -> {a flag it does not take: why, and what to type}
    "perplexity": {"--batch-size": "elmo train's global batch (rows); the sentences perplexity scores a batch are "
                                   "--eval-batch-size, as in elmo train's evaluations"},
    "engine": {"--device": f"none here: elmo engine validates its export {_ON_THE_CPU}, and builds for this "
                           f"machine's GPU by itself where there is one (TensorRT, else ONNX Runtime CUDA)"},
    "export triton": {"--max-queue-delay-us": "now --max-wait-ms, in milliseconds (2000 us is --max-wait-ms 2)"},
    "export onnx": {"--device": f"none here: elmo export onnx validates the graph on ONNX Runtime's CPU provider "
                                f"{_ON_THE_CPU}; elmo export tensorrt builds a GPU engine from the export"},
}


def refusal_notes(command: str, words: list[str]) -> list[str]:
    """A note for each refused or older flag among the ``words`` given to ``command`` (``perplexity``,
    ``export onnx``): what to type instead, added to any error of its parser (the flag it does not
    take, or the one it needs, ``--text``, where ``--train`` was given)."""
    flags = dict.fromkeys(w.split("=", 1)[0] for w in words if w.startswith("--"))
    return [f"{flag}: {why}" for flag in flags if (why := _refusal(command, flag))]


def _refusal(command: str, flag: str) -> str | None:
    if flag in REFUSED.get(command, {}):
        return REFUSED[command][flag]
    return f"now {RENAMED[flag]}" if flag in RENAMED else None


def add_flag(group: Flags, meaning: str, **kwargs: Any) -> argparse.Action:
    """``meaning``'s flag (help: the table's unless given)."""
    m = MEANINGS[meaning]
    kwargs.setdefault("help", m.help)
    if m.switch:
        kwargs.setdefault("action", "store_true")
    if m.path and kwargs.get("type", str) is str:
        kwargs["type"] = path_value
    return group.add_argument(m.flag, dest=m.dest, **kwargs)


def path_value(value: str) -> str:
    """A path flag's value: never empty, which the file system would read as the current directory
    (an unset shell variable: ``--text "$CORPUS"``)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset shell variable?); give a file, a directory, a "
                                         "glob or a URI")
    return value


def add_model(parser: argparse.ArgumentParser, help: str) -> None:  # noqa: A002
    """``--model`` and ``--weights``."""
    add_flag(parser, "model", help=help)
    add_flag(parser, "weights")


def need_model(args: argparse.Namespace, command: str) -> str:
    if args.model is None:
        from elmo_core.errors import InputError

        raise InputError(f"give the model: elmo {command} --model DIR")
    return args.model


def check_torch_model(model: str | None, command: str) -> None:
    """Refuse an export directory for a command that runs the torch model only (it has no --backend)."""
    from elmo_core.errors import InputError
    from inference.registry import exported_backend

    kind = None if model is None else exported_backend(model)
    if kind is not None:
        raise InputError(f"{model}: an {kind} export; elmo {command} runs a model directory (options.json and its "
                         f"weights) on torch: give --model the directory the export was made from")


def field_dest(f: Field) -> str:
    meaning = f.metadata.get("meaning")
    return MEANINGS[meaning].dest if meaning else f.name


def cli_fields(cls: type) -> list[Field]:
    """The fields of ``cls`` that are flags (metadata ``cli`` not False)."""
    return [f for f in fields(cls) if f.metadata.get("cli", True)]


def field_values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """{field name: the parsed value} for each flag of ``cls``."""
    return {f.name: getattr(args, field_dest(f)) for f in cli_fields(cls)}


def add_fields(parser: argparse.ArgumentParser, cls: type, group: str | None = None,
               negatable: bool = False, groups: dict[str, Flags] | None = None) -> dict[str, Flags]:
    """One flag per field of ``cls`` (``cli_fields``), in the argument group its metadata names
    (else ``group``; else the parser). ``negatable``: booleans take --no-NAME too; ``groups``: those
    made by an earlier call, shared. Returns the groups by name. The parsed arguments carry
    ``field_dests`` (a field's name -> its flag's dest, where they differ): ``flag_spelling``."""
    groups = {"run": parser} if groups is None else groups
    types = typing.get_type_hints(cls)  # the fields' types, resolved (the modules write them as strings)
    for f in cli_fields(cls):
        name = f.metadata.get("group") or group
        target = parser if name is None else groups.get(name) or groups.setdefault(name, parser.add_argument_group(name))
        _add_field(target, f, types[f.name], negatable)
    renamed = {f.name: field_dest(f) for f in cli_fields(cls) if field_dest(f) != f.name}
    parser.set_defaults(field_dests={**(parser.get_default("field_dests") or {}), **renamed})
    return groups


def _add_field(group: Flags, f: Field, kind: Any, negatable: bool) -> None:
    """``f``'s flag; ``kind``: its type (``bool``, ``int | None``, ``tuple[str, ...]``, ...): the
    value's converter is the first of int, float in it, else str."""
    meta, default = f.metadata, (None if f.default is MISSING else f.default)
    default = meta.get("cli_default", default)
    kwargs: dict[str, Any] = {k: meta[k] for k in ("choices", "metavar", "required") if meta.get(k) is not None}
    if isinstance(default, bool) or kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction if negatable or default else "store_true"
    elif meta.get("action") == "append":
        kwargs["action"], default = "append", list(default)
    else:
        kwargs["type"] = next((t for t in (int, float) if t in _members(kind)), str)
    meaning = meta.get("meaning")
    text = meta.get("help") or MEANINGS[meaning].help
    shown = default is not None and not isinstance(default, bool) and default not in ((), [])
    kwargs.update(default=default, help=f"{text} (default {default})" if shown else text)
    if meaning:
        add_flag(group, meaning, **kwargs)
    else:
        group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kwargs)


def _members(kind: Any) -> tuple:
    """The types a field's annotation allows at its top level (``int | None`` -> int, NoneType)."""
    return typing.get_args(kind) if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union \
        else (kind,)


def flag_spelling(args: argparse.Namespace) -> Callable[[str], str]:
    """How a command names a library's setting: a field of its options (``max_tokens_per_batch``)
    or a dest (``gamma``) -> the flag its users type (``--max-batch-tokens``, ``--gamma``): every
    flag of this CLI is its dest spelled with dashes. A name that is no flag of the command (its
    parsed ``args`` hold no such dest) stays as it is. ``SettingError.spelled`` takes it."""
    renamed, given = getattr(args, "field_dests", {}), vars(args)

    def spell(name: str) -> str:
        dest = renamed.get(name, name)
        return "--" + dest.replace("_", "-") if dest in given and dest not in _NOT_FLAGS else name

    return spell


_NOT_FLAGS = frozenset({"func", "command", "export_kind", "field_dests", "rest"})  # the parsers' own dests
