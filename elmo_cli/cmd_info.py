"""``elmo info MODEL``: the architecture and parameter count of a model."""
from __future__ import annotations

import argparse
import json

from elmo_core import load_bilm, resolve_model
from elmo_core.model_io import count_parameters, file_sha256


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="print a model's architecture and parameter count")
    p.add_argument("model", help="model directory, or options.json (then give WEIGHTS)")
    p.add_argument("weights", nargs="?", help="weights file (.hdf5 or .safetensors)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def describe(model_path: str, weights: str | None = None) -> dict:
    files = resolve_model(model_path, weights)
    model = load_bilm(files.options, files.weights)
    cfg = model.config
    pad_row = cfg.char_cnn.embedding_dim  # the all-zero padding row of char_embed is no weight of the file
    enc = count_parameters(model.encoder) - pad_row
    return {
        "options": str(files.options), "weights": str(files.weights), "format": files.format,
        "weights_sha256": file_sha256(files.weights),
        "architecture": cfg.to_dict(),
        "output_layers": cfg.n_output_layers, "output_dim": cfg.output_dim,
        "parameters": {"total": count_parameters(model) - pad_row, "char_cnn": enc, "lstm": count_parameters(model.lstm)},
    }


def run(args: argparse.Namespace) -> int:
    info = describe(args.model, args.weights)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    ls, cc = info["architecture"]["lstm"], info["architecture"]["char_cnn"]
    print(f"model     {info['options']}  +  {info['weights']} ({info['format']})")
    print(f"char CNN  char dim {cc['embedding']['dim']}, filters {cc['filters']}, {cc['n_highway']} highway, "
          f"{cc['activation']}, {cc['max_characters_per_token']} chars/token")
    print(f"biLSTM    {ls['n_layers']} layers, cell {ls['dim']}, projection {ls['projection_dim']}, "
          f"cell_clip {ls['cell_clip']}, proj_clip {ls['proj_clip']}, skip {ls['use_skip_connections']}")
    print(f"output    {info['output_layers']} layers x {info['output_dim']}")
    p = info["parameters"]
    print(f"params    {p['total']:,} (char CNN {p['char_cnn']:,}, LSTM {p['lstm']:,})")
    print(f"sha256    {info['weights_sha256']}")
    return 0
