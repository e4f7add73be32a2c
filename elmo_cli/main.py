"""``elmo``: the command line. Library code raises typed errors; only this module maps them to exit codes.

Each subcommand lives in an ``elmo_cli.cmd_*`` module with ``register(subparsers)``; those modules
are the only place where argparse meets the library, and where work spanning packages (train,
then export; corpus, model, embed) is composed.

Exit codes: 0 done, 2 an error (the message names the file, row, column or option and what to
do), 130 interrupted (SIGINT, Ctrl-C), 143 terminated (SIGTERM). SIGTERM stops a command the way
Ctrl-C does: the library's cleanup runs (temporary files removed, finished work kept).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from typing import Iterator

COMMAND_MODULES = ("elmo_cli.cmd_info", "elmo_cli.cmd_train", "elmo_cli.cmd_export", "elmo_cli.cmd_embed",
                   "elmo_cli.cmd_demo", "elmo_cli.cmd_probe", "elmo_cli.cmd_serve", "elmo_cli.cmd_tokens",
                   "elmo_cli.cmd_convert")
EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED = 2, 130, 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where SIGINT would raise KeyboardInterrupt, so the same cleanup runs."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def build_parser() -> argparse.ArgumentParser:
    from elmo_cli.vocabulary import command_parsers

    parser = argparse.ArgumentParser(prog="elmo", description="Pretrain, export and run ELMo biLMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for command in command_parsers(parser):  # the parser whose flags name the command's settings in its errors
        command.set_defaults(command_parser=command)
    return parser


def _message(error: Exception, args: argparse.Namespace) -> str:
    """An error's message; a setting it names is named by the command's flag (``--max-batch-tokens``)."""
    from elmo_cli.vocabulary import flag_spelling
    from elmo_core.errors import SettingError

    if isinstance(error, SettingError):
        return error.spelled(flag_spelling(args.command_parser))
    return str(error)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held while the block runs (the commands' imports), then raised.

    An interruption inside a third-party import (numpy, torch) can be swallowed by that package's
    own handlers and leave a half-initialised module behind, which then fails with an unrelated
    traceback. Held, the signal is raised here, after the imports, a second or two later."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers need the main thread
        yield
        return
    held: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if held:
        raise Terminated() if held[0] == signal.SIGTERM else KeyboardInterrupt()


def _run(argv: list[str] | None) -> int:
    command = "elmo"
    try:
        with _signals_held():
            from elmo_core.errors import ElmoError

            parser = build_parser()
        args = parser.parse_args(argv)
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
    if threading.current_thread() is not threading.main_thread():  # signal handlers need the main thread
        return _run(argv)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _run(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
