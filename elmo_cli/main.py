"""``elmo``: the command line. Library code raises typed errors; only this module maps them to exit codes.

Each subcommand lives in an ``elmo_cli.cmd_*`` module with ``register(subparsers)``; those modules
are the only place where argparse meets the library, and where work spanning packages (train,
then export; corpus, model, embed) is composed.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from elmo_core.errors import ElmoError

COMMAND_MODULES = ("elmo_cli.cmd_info", "elmo_cli.cmd_train", "elmo_cli.cmd_export", "elmo_cli.cmd_embed",
                   "elmo_cli.cmd_demo")
EXIT_ERROR, EXIT_INTERRUPTED = 2, 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elmo", description="Pretrain, export and run ELMo biLMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ElmoError as e:
        print(f"elmo {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"elmo {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
