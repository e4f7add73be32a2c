"""One vocabulary for ``elmo``: every flag of every subcommand has help, one meaning has one name
(``elmo_cli.vocabulary.MEANINGS``), and the spellings before it are refused (pre-1.0: no aliases)."""
from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from elmo_cli.main import build_parser
from elmo_cli.vocabulary import MEANINGS, REFUSED, RENAMED, add_flag, flag_spelling
from elmo_core.errors import SettingError

ROOT = Path(__file__).resolve().parents[2]
OLD = RENAMED  # the text a command reads is --text; what it writes, --out; ...
# Every command is classified here, twice; a command that is not fails the walk (``shape_problems``).
# What it prints: a result (then --json, the result alone on stdout) or not.
REPORTING = ("info", "verify", "embed", "perplexity", "train", "probe", "engine", "export onnx", "export tensorrt",
             "export triton", "default-model", "sample-corpus", "sotu-corpus", "dump-tokens", "convert-efml")
NOT_REPORTING = ("serve", "demo")  # a server (its results are HTTP answers); a walk-through for people
# Whether it runs a model: then --threads and --device. engine and export onnx run it only to validate
# an export against the torch backend on the CPU (formats/export_spec.py): --threads, and --device
# refused with why (``REFUSED``).
MODEL_RUNNERS = ("embed", "serve", "train", "perplexity", "probe", "demo", "dump-tokens", "default-model")
CPU_VALIDATORS = ("engine", "export onnx")
MODEL_FREE = ("info", "verify", "export tensorrt", "export triton", "sample-corpus", "sotu-corpus", "convert-efml")


def commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Each (nested) subcommand by name, 'embed' or 'export onnx'."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, p in action.choices.items():
                found[prefix + name] = p
                found.update(commands(p, f"{prefix}{name} "))
    return found


def problems(parser: argparse.ArgumentParser) -> list[str]:
    """A flag without help; one dest (meaning) under two names; a flag spelled as a meaning's older
    spelling; a meaning's dest under a name not its own."""
    found, names = [], {}
    for command, p in commands(parser).items():
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not a.help or a.help == argparse.SUPPRESS:
                found.append(f"elmo {command} {'/'.join(a.option_strings) or a.dest}: no help")
            if a.option_strings:
                names.setdefault(a.dest, {}).setdefault(a.option_strings[0], []).append(command)
                if a.option_strings[0] in OLD:
                    found.append(f"elmo {command} {a.option_strings[0]}: an older spelling of "
                                 f"{OLD[a.option_strings[0]]}")
    for dest, flags in names.items():
        if len(flags) > 1:
            found.append(f"dest {dest} has several names: {flags}")
        if dest in MEANINGS and set(flags) != {MEANINGS[dest].flag}:
            found.append(f"{dest} is {MEANINGS[dest].flag}, not {sorted(flags)}")
    return found


def test_every_flag_has_help_and_each_meaning_one_name():
    assert problems(build_parser()) == []


def test_the_check_finds_a_bad_parser():
    parser = argparse.ArgumentParser(prog="bad")
    sub = parser.add_subparsers()
    a, b = sub.add_parser("a"), sub.add_parser("b")
    add_flag(a, "max_batch_tokens", type=int)
    b.add_argument("--batch-tokens", dest="max_batch_tokens", type=int, help="tokens per batch")
    b.add_argument("--rows", type=int)
    b.add_argument("--workers", type=int, help="Ray actors")
    found = "\n".join(problems(parser))
    assert "elmo b --rows: no help" in found
    assert "dest max_batch_tokens has several names" in found
    assert "elmo b --workers: an older spelling of --replicas" in found


def leaves(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The commands that run (``export onnx``, not ``export``)."""
    return {c: p for c, p in commands(parser).items()
            if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)}


def shape_problems(parser: argparse.ArgumentParser) -> list[str]:
    """A command not classified above; a positional argument (the text is --text, the output --out,
    the model --model); a reporting one without --json; a model runner without --threads or
    --device; a CPU validator without --threads."""
    found = []
    for command, p in leaves(parser).items():
        flags = p._option_string_actions
        found += [f"elmo {command}: positional {a.dest} (a flag: --text, --out, --model)" for a in p._actions
                  if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]
        if command not in REPORTING + NOT_REPORTING or command not in MODEL_RUNNERS + CPU_VALIDATORS + MODEL_FREE:
            found.append(f"elmo {command}: not classified (tests/cli/test_vocabulary.py: what it reports, whether "
                         f"it runs a model)")
        wanted = (["--json"] if command in REPORTING else []) + \
            (["--threads", "--device"] if command in MODEL_RUNNERS else ["--threads"] if command in CPU_VALIDATORS else [])
        found += [f"elmo {command}: no {f}" for f in wanted if f not in flags]
        if command in CPU_VALIDATORS and "--device" not in REFUSED.get(command, {}):
            found.append(f"elmo {command}: --device neither taken nor refused with why")
        found += [f"elmo {command}: takes {f}, which it refuses" for f in REFUSED.get(command, {}) if f in flags]
    return found


def test_every_command_is_shaped_alike():
    parser = build_parser()
    assert shape_problems(parser) == []
    assert set(REFUSED) <= set(leaves(parser))  # each refusal is a command's
    assert sorted(leaves(parser)) == sorted(REPORTING + NOT_REPORTING) == sorted(MODEL_RUNNERS + CPU_VALIDATORS + MODEL_FREE)


def test_the_walk_finds_a_command_shaped_otherwise():
    parser = argparse.ArgumentParser(prog="bad")
    sub = parser.add_subparsers()
    sub.add_parser("embed").add_argument("--threads", type=int, help="threads")  # no --device, no --json
    sub.add_parser("newcomer")
    positional = sub.add_parser("verify")
    add_flag(positional, "json")
    positional.add_argument("output_dir", help="the job's OUTPUT_DIR")
    nested = sub.add_parser("export").add_subparsers()
    add_flag(nested.add_parser("onnx"), "json")  # no --threads
    assert sorted(shape_problems(parser)) == [
        "elmo embed: no --device", "elmo embed: no --json", "elmo export onnx: no --threads",
        "elmo newcomer: not classified (tests/cli/test_vocabulary.py: what it reports, whether it runs a model)",
        "elmo verify: positional output_dir (a flag: --text, --out, --model)"]


def test_the_parsers_build_without_torch():
    """`elmo --help` and the parsers of commands that need no options record import no model code."""
    code = ("import sys; from elmo_cli.main import build_parser; build_parser({0}); "
            "print(sorted(m for m in ('torch', 'pyarrow', 'pandas', 'numpy') if m in sys.modules))")
    for commands_ in ("[]", "['info']", "['convert-efml']", "['dump-tokens']"):
        r = subprocess.run([sys.executable, "-c", code.format(commands_)], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
        assert (r.returncode, r.stdout.strip()) == (0, "[]"), (commands_, r.stderr[-2000:])


def test_older_spellings_are_refused():
    parser = build_parser()
    parsers = commands(parser)
    assert [(c, f) for c, p in parsers.items() for f in OLD if f in p._option_string_actions] == []
    with pytest.raises(SystemExit):
        parser.parse_args(["embed", "--text", "in", "--out", "out", "--model", "m", "--max-tokens-per-batch", "300"])
    for positional in (["embed", "in", "out", "--model", "m"], ["verify", "out"], ["sample-corpus", "c"],
                       ["sotu-corpus", "c"], ["convert-efml", "efml", "ours"], ["train", "--train", "t", "--out", "r"],
                       ["train", "--train", "5", "--text", "t", "--out", "r"],  # not --train-eval-sentences 5
                       ["export", "onnx", "--mod", "m", "--out", "o"]):  # a flag is typed whole
        with pytest.raises(SystemExit):
            parser.parse_args(positional)
    with pytest.raises(SystemExit):
        parser.parse_args(["info", "DIR"])  # the model is --model


def parsed(p: argparse.ArgumentParser) -> argparse.Namespace:
    """What ``p`` parses to when every flag keeps its default (required ones too)."""
    return argparse.Namespace(**{a.dest: a.default for a in p._actions}, **p._defaults)


def test_every_options_field_is_named_by_the_flag_its_command_has():
    """A library's setting (a field of EmbedOptions, TrainOptions, ServeLimits, ...) is named in an
    error by the flag the user typed, the one its command's parser has for it (``flag_spelling``)."""
    from elmo_cli.vocabulary import cli_fields, field_dest
    from inference.run_settings import RunSettings
    from pipelines.options import EmbedOptions
    from serving.limits import ConnectionLimits, ServeLimits
    from training.options import TrainOptions

    parsers = commands(build_parser())
    records = {"embed": (EmbedOptions, RunSettings), "serve": (ServeLimits, ConnectionLimits), "train": (TrainOptions,)}
    for command, classes in records.items():
        spell, flags = flag_spelling(parsed(parsers[command])), parsers[command]._option_string_actions
        for f in (f for cls in classes for f in cli_fields(cls)):
            assert spell(f.name) in flags and flags[spell(f.name)].dest == field_dest(f), (command, f.name)
    for command, p in parsers.items():  # every flag of every command: its dest spelled with dashes
        spell = flag_spelling(parsed(p))
        for a in p._actions:
            if a.option_strings and a.dest != argparse.SUPPRESS:
                assert spell(a.dest) in a.option_strings, (command, a.dest, a.option_strings)
    embed, train = flag_spelling(parsed(parsers["embed"])), flag_spelling(parsed(parsers["train"]))
    assert [embed(n) for n in ("max_tokens_per_batch", "max_sentence_length", "workers", "num_gpus_per_worker",
                               "gamma", "output")] == ["--max-batch-tokens", "--max-sentence-tokens", "--replicas",
                                                       "--num-gpus-per-replica", "--gamma", "--output"]
    assert train("column") == "--text-column" and train("not_a_setting") == "not_a_setting"
    assert embed("func") == "func" and embed("command") == "command"  # the parsers' own dests are no flags
    assert flag_spelling(parsed(parsers["export onnx"]))("gamma") == "--gamma"


def test_a_setting_error_keeps_its_names_through_pickling():
    """Ray and Spark send errors between processes pickled: the names stay marked for the CLI."""
    e = pickle.loads(pickle.dumps(SettingError("`max_tokens_per_batch` (3) must be at least `max_sentence_length`")))
    assert str(e) == "max_tokens_per_batch (3) must be at least max_sentence_length"
    assert e.settings == ("max_tokens_per_batch", "max_sentence_length")
    assert e.spelled(flag_spelling(parsed(commands(build_parser())["embed"]))) == \
        "--max-batch-tokens (3) must be at least --max-sentence-tokens"
