"""Every ``--flag`` the README and docs/ name exists: on the `elmo` subcommand the text runs, or, for
the other tools they show (bench scripts, pip, pytest, ...), on that tool."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from elmo_cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
ELMO = re.compile(r"(?:^|[\s`(])(?:\.venv/bin/)?elmo ([a-z][a-z-]*)((?:[^`|;&]|\\\n)*)")
# flags of the other tools the docs show (their own documentation is theirs)
OTHER_TOOLS = {"--no-deps", "--logdir", "--options-file", "--weight-file", "--cuda-device", "--all", "--top",
               "--average", "--use-sentence-keys", "--nproc-per-node", "--nproc_per_node", "--model-repository",
               "--index-url", "--extra-index-url", "--upgrade", "--standalone", "--nnodes", "--address", "--head",
               "--port", "--num-cpus", "--block", "--help", "--version", "--user", "--break-system-packages",
               "--no-index", "--find-links", "--backend-directory", "--http-port", "--runtime-env-json"}


def _subcommands(parser: argparse.ArgumentParser | None = None, prefix: str = "") -> dict[str, set[str]]:
    """Each (nested) subcommand, 'embed' or 'export onnx', and its flags."""
    parser = parser or build_parser()
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, p in action.choices.items():
                found[prefix + name] = {s for a in p._actions for s in a.option_strings}
                found.update(_subcommands(p, f"{prefix}{name} "))
    return found


def _code(text: str) -> list[str]:
    """Code blocks' lines and inline code spans: where a flag is something to type."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return [line for b in blocks for line in b.split("\n")] + inline


def _bench_flags() -> set[str]:
    return {m for f in (ROOT / "bench").glob("*.py") for m in re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"",
                                                                         f.read_text())}


def test_every_flag_the_docs_name_exists():
    commands = _subcommands()
    known = set().union(*commands.values()) | _bench_flags() | OTHER_TOOLS
    problems = []
    for doc in DOCS:
        for code in _code(doc.read_text(encoding="utf-8")):
            for sub, rest in ELMO.findall(code):
                words = rest.split()
                if words and f"{sub} {words[0]}" in commands:  # a nested one: elmo export onnx
                    sub = f"{sub} {words[0]}"
                if sub in commands:
                    problems += [f"{doc.name}: `elmo {sub} ... {f}`: elmo {sub} has no {f}"
                                 for f in FLAG.findall(rest) if f not in commands[sub] | {"--help"}]
            problems += [f"{doc.name}: {f} (in `{code.strip()[:60]}`)" for f in FLAG.findall(code) if f not in known]
    assert not problems, "\n".join(sorted(set(problems)))


PATH_LIKE = re.compile(r"^(?!\.\.\.)(?:[A-Z][A-Z0-9_]*|[^-].*[/.].*|['\"$].*)$")  # OUTPUT_DIR, corpus/, a.txt, 'x/*', $(IN)


def positional_uses(text: str, commands: dict[str, set[str]]) -> list[str]:
    """`elmo SUB WORD` where WORD is no flag: every command takes its text, output and model by flag
    (--text, --out, --model), none positionally."""
    found = []
    for code in _code(text):
        for sub, rest in ELMO.findall(code):
            words = rest.replace("\\\n", " ").split()
            if words and f"{sub} {words[0]}" in commands:
                sub, words = f"{sub} {words[0]}", words[1:]
            if sub in commands and words and PATH_LIKE.match(words[0]):
                found.append(f"`elmo {sub} {' '.join(words[:3])}`")
    return found


def test_the_docs_give_every_argument_by_its_flag():
    commands = _subcommands()
    problems = [f"{doc.name}: {use}" for doc in DOCS for use in positional_uses(doc.read_text(encoding="utf-8"), commands)]
    assert not problems, "\n".join(problems)
    assert positional_uses("```\nelmo embed corpus/ out/ --model M\nelmo verify --out out/\n```", commands) == \
        ["`elmo embed corpus/ out/ --model`"]
