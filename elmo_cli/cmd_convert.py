"""``elmo convert-efml --model EFML_DIR --out DIR``: an ELMoForManyLangs model directory in our format (options.json
with its ``dictionaries``, char.dic / word.dic, model.safetensors), which every command loads."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from elmo_cli.vocabulary import Subcommands, add_flag


def register(sub: Subcommands) -> None:
    p = sub.add_parser("convert-efml", help="convert an ELMoForManyLangs model directory (HIT-SCIR) to ours",
                       description="Read an ELMoForManyLangs model directory (config.json, char.dic, word.dic, "
                                   "token_embedder.pkl, encoder.pkl; the .pkl files are read as plain tensors, "
                                   "never unpickled) and write it as options.json + model.safetensors + dictionaries.")
    add_flag(p, "model", required=True, metavar="EFML_DIR", help="the ELMoForManyLangs model directory to convert")
    add_flag(p, "out", required=True, metavar="DIR", help="the directory to write our model into (then --model DIR "
                                                          "everywhere)")
    add_flag(p, "json")
    p.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    from elmo_core.errors import InputError
    from formats import save_model
    from formats.efml import load_efml
    from storage.atomic import atomic_dir

    out = Path(args.out)
    if out.is_file() or (out.is_dir() and any(out.iterdir())):
        raise InputError(f"--out {out}: {'is a file' if out.is_file() else 'is not empty'}; give a new directory "
                         f"(the converted model's files are never written beside another model's)")
    model = load_efml(args.model)
    if out.is_dir():  # empty (a mount point, say): its files each written whole
        save_model(model, out, "safetensors")
    else:
        with atomic_dir(out, "options.json") as tmp:  # the model appears whole, or not at all; never over another's
            save_model(model, tmp, "safetensors")
    cfg = model.config
    if args.json:
        print(json.dumps({"out": str(out), "characters": cfg.char_cnn.n_characters - 1,
                          "words": cfg.dictionaries.n_words if cfg.dictionaries.words else 0,
                          "layers": cfg.n_output_layers, "dim": cfg.output_dim}))
        return 0
    words = f", words {cfg.dictionaries.n_words:,} x {cfg.dictionaries.word_dim}" if cfg.dictionaries.words else ""
    print(f"wrote {out}: characters {cfg.char_cnn.n_characters - 1:,}{words}, "
          f"{cfg.n_output_layers} layers of {cfg.output_dim}")
    return 0
