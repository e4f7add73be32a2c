"""``elmo info --model PATH``: what a directory or file this project reads or writes holds.

A model directory (or options.json + weights): architecture and parameter count. An `elmo export`
directory: kind, precision, outputs, parity, int8 plan and source model. `elmo engine`'s OUT: the exports it
holds. An `elmo embed` OUTPUT_DIR: rows, tokens, vectors, model and options; one of its shards: its input rows,
counts, vectors and model sha256 (its footer); `elmo embed --format hdf5`'s file: sentences, vectors and
request (its metadata). An `elmo train` RUN_DIR: the run's summary and its model.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elmo_cli.human import labelled_lines, value_text
from elmo_cli.vocabulary import Subcommands, add_flag, add_model
from storage.atomic import read_json_object
from elmo_core.errors import InputError
from storage.locations import file_sha256, is_uri

if TYPE_CHECKING:
    import torch

    from pipelines.sink import Output

RUN_SUMMARY, RUN_INFO = "summary.json", "run.json"


def register(sub: Subcommands) -> None:
    p = sub.add_parser("info", help="what a model, export, engine, embed output or training run directory holds")
    add_model(p, "a model directory (or options.json, then give --weights), an export directory, `elmo engine`'s "
                 "OUT, an `elmo embed` OUTPUT_DIR (or one of its shards, or its --format hdf5 file) or a RUN_DIR")
    add_flag(p, "out", help="what a command wrote: an `elmo embed` OUTPUT_DIR (or one of its shards, or its "
                           "--format hdf5 file), `elmo engine`'s OUT or an `elmo train` RUN_DIR (read as --model "
                           "reads it)")
    add_flag(p, "json", help="print JSON")
    p.set_defaults(func=run)


def describe(model_path: str, weights: str | None = None) -> dict:
    from formats import load_bilm, resolve_model
    from training.default_model import CARD

    files = resolve_model(model_path, weights)
    model = load_bilm(files.options, files.weights)
    cfg = model.config
    pad_row = cfg.char_cnn.embedding_dim  # the all-zero padding row of char_embed is no weight of the file
    enc = _parameters(model.encoder) - pad_row
    card = files.options.parent / CARD
    return {
        "kind": "model", "options": str(files.options), "weights": str(files.weights), "format": files.format,
        "weights_sha256": file_sha256(files.weights),
        "architecture": cfg.to_dict(),
        "output_layers": cfg.n_output_layers, "output_dim": cfg.output_dim,
        "parameters": {"total": _parameters(model) - pad_row, "char_cnn": enc, "lstm": _parameters(model.lstm)},
        "card": read_json_object(card) if card.is_file() else None,  # `elmo default-model`'s record
    }


def _parameters(module: "torch.nn.Module") -> int:
    return sum(p.numel() for p in module.parameters())


def _export(path: Path) -> dict:
    from formats.export_manifest import MANIFEST_NAME, check_file, read_manifest

    kind = read_json_object(path / MANIFEST_NAME).get("kind")
    m = read_manifest(path, str(kind))
    artifact = m.get("onnx") if kind == "onnx" else m.get("engine")
    if isinstance(artifact, dict):  # the parity it reports is the file's it names: missing or changed, said so
        check_file(path, artifact)
    source = {k: v for k, v in m.get("source", {}).items() if k != "architecture"}
    return {"kind": f"{kind} export", "path": str(path), "precision": m.get("precision"),
            "outputs": m.get("outputs"), "parity": m.get("parity"), "source": source,
            "architecture": m.get("source", {}).get("architecture"),
            **({"int8_plan": m["int8"].get("describe")} if isinstance(m.get("int8"), dict) else {})}


def inspect(path_arg: str, weights: str | None = None) -> dict:
    """What the directory at ``path_arg`` is and holds (see the module doc); ``weights`` only for a
    model (another directory has no weights to choose)."""
    info = _embed_output_on_a_store(path_arg) if is_uri(path_arg) else _written_by_the_project(Path(path_arg))
    if info is None:
        return describe(path_arg, weights)
    if weights is not None:
        raise InputError(f"--weights {weights}: {info['path']} is not a model directory ({info['kind']}), so there "
                         f"are no weights to choose: leave --weights out")
    return info


def _written_by_the_project(path: Path) -> dict | None:
    """An export, an embed output, a training run or an engine output at ``path``; None for anything else."""
    from formats.export_manifest import MANIFEST_NAME

    if path.is_file():
        return _embed_file(path)
    if path.is_dir() and (path / MANIFEST_NAME).is_file():
        return _export(path)
    if path.is_dir() and any(path.glob("_job.*")):
        from pipelines.output_dir import LocalDir

        return _embed_output(LocalDir(path), str(path))
    if path.is_dir() and (path / RUN_INFO).is_file():
        summary = read_json_object(path / RUN_SUMMARY) if (path / RUN_SUMMARY).is_file() else {}
        model = path / "model"
        return {"kind": "elmo train run", "path": str(path), "finished": bool(summary),
                **{k: summary.get(k) for k in ("step", "tokens", "valid", "valid_over_train", "batching")},
                "model": describe(str(model)) if (model / "options.json").is_file() else None}
    exports = [d for d in sorted(path.iterdir()) if (d / MANIFEST_NAME).is_file()] if path.is_dir() else []
    if exports and not (path / "options.json").is_file():
        return {"kind": "elmo engine output", "path": str(path), "exports": [_export(d) for d in exports]}
    return None


def _embed_file(path: Path) -> dict | None:
    """`elmo embed --format hdf5`'s file, or a file of an `elmo embed` OUTPUT_DIR: a shard (described
    from its footer) or a side record (InputError naming the directory, which is what is described);
    None for any other file."""
    from pipelines.hdf5_output import output_info
    from pipelines.output_dir import LocalDir
    from pipelines.sink import side_names

    info = output_info(path)
    if info is not None or not path.name.startswith(("part-", "_")):  # an output's names: shards, side records
        return info
    out = LocalDir(path.parent)
    if side_names(out) is None:
        return None
    if path.name.startswith("part-"):
        return _embed_shard(out, path)
    raise InputError(f"{path}: a record of the elmo embed OUTPUT_DIR {out}, not an output of its own: elmo info "
                     f"--out {out} describes the output (elmo verify --out {out} checks it)")


def _embed_shard(out: "Output", path: Path) -> dict:
    """A shard of an `elmo embed` OUTPUT_DIR, from its footer (``pipelines.sink``): the input rows it
    holds, its counts, the sha256 of the model its writer loaded and its vectors."""
    from pipelines.schema import ELMO_COLUMN, vectors_of
    from pipelines.shard_files import shard_format
    from pipelines.sink import COUNTS, footer_record

    record = footer_record(out, path.name)
    if record is None:
        raise InputError(f"{path}: named as a shard of the elmo embed OUTPUT_DIR {out}, but its footer holds no shard "
                         f"record (damaged, or not elmo embed's): elmo verify --out {out} checks every shard")
    with open(path, "rb") as f:
        schema = shard_format(path.name).schema(f)
    return {"kind": "elmo embed shard", "path": str(path), "output_dir": str(out), "input": record.get("input_path"),
            "row_start": record.get("row_start"), **{k: record.get(k) for k in COUNTS},
            "vectors": vectors_of(schema.field(ELMO_COLUMN)) if ELMO_COLUMN in schema.names else None,
            "model_sha256": record.get("model_sha256")}


def _embed_output_on_a_store(uri: str) -> dict | None:
    """An `elmo embed` OUTPUT_DIR on an object store, read by its records alone (its shards are not
    fetched); None where the prefix holds no job record (a model there is described as a model)."""
    from pipelines.errors import OutputDirError
    from pipelines.output_dir import open_output
    from pipelines.sink import side_names

    try:
        out = open_output(uri)
    except OutputDirError:  # a store elmo embed does not write to (gs://, hdfs://): a model's, perhaps
        return None
    return _embed_output(out, uri) if side_names(out) is not None else None


def _embed_output(out: "Output", path: str) -> dict:
    """An `elmo embed` OUTPUT_DIR (local or on a store) at ``path``: its job record and manifest
    (``pipelines.sink``)."""
    from pipelines.schema import ELMO_COLUMN, vectors_of
    from pipelines.sink import COUNTS, SUCCESS_FILE, side_names

    names = side_names(out)
    if names is None:
        raise InputError(f"{path}: holds _job.* files but no job record of elmo embed (_job.parquet or _job.arrow)")
    job_name, manifest_name = names
    m = out.read_record(manifest_name) if out.size(manifest_name) is not None else {}
    job = out.read_record(job_name)
    counts = {k: v if isinstance(v := m.get(k), int) and not isinstance(v, bool) else None for k in COUNTS}
    shards = m.get("shards")  # a damaged record's fields of another type are shown as unknown: `elmo verify` names them
    schema = out.read_schema(job_name)  # the job's, its shards'
    return {"kind": "elmo embed output", "path": str(path), "finished": out.size(SUCCESS_FILE) is not None,
            **counts, "shards": len(shards) if isinstance(shards, list) else None,
            "vectors": vectors_of(schema.field(ELMO_COLUMN)) if ELMO_COLUMN in schema.names else None,
            "model": job.get("model"), "options": job.get("options")}


def run(args: argparse.Namespace) -> int:
    if args.model is not None and args.out is not None:
        raise InputError("elmo info reads one directory: give --model or --out, not both")
    path = args.model if args.model is not None else args.out
    if path is None:
        raise InputError("give a directory: elmo info --model MODEL_DIR (or --out, what elmo embed, engine or train "
                         "wrote); make info MODEL=DIR")
    info = inspect(path, args.weights)
    if args.json:
        print(json.dumps(info, indent=2))
    elif info["kind"] == "model":
        _print_model(info)
    else:
        _print_other(info)
    return 0


def _print_model(info: dict) -> None:
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
    if card := info.get("card"):
        held = card.get("held_out") or {}
        print(f"trained   {card.get('command')} ({card.get('built')}): {card.get('tokens', 0):,} tokens in "
              f"{card.get('train_s', 0) / 60:.0f} min; held-out perplexity {held.get('mean', float('nan')):.1f}; "
              f"stored {card.get('storage')}")


def _print_other(info: dict[str, Any]) -> None:
    print(f"{info['kind']}: {info['path']}")
    if info["kind"].endswith(" export"):
        _print_export(info, "")
        return
    for key, value in info.items():
        if key in ("kind", "path"):
            continue
        if key == "model" and isinstance(value, dict) and value.get("kind") == "model":
            print("model:")
            _print_model(value)
        elif key == "vectors" and isinstance(value, dict):
            print(*labelled_lines({key: _vectors_text(value)}), sep="\n")
        elif key == "exports":
            for e in value:
                print(f"{e['kind']}: {e['path']}")
                _print_export(e, "  ")
        else:
            print(*labelled_lines({key: value}), sep="\n")


def _vectors_text(v: dict[str, Any]) -> str:
    """An output's vectors (``pipelines.schema.vectors_of``) on one line: one per token, 3 layers x 1,024 float16."""
    shape = f"{v['layers']} layers x {v['dim']:,}" if v.get("layers") else f"{v['dim']:,}"
    return f"one per {'row (pooled)' if v.get('pooled') else 'token'}, {shape} {v.get('dtype')}"


def _print_export(info: dict[str, Any], indent: str) -> None:
    """An export's precision, outputs, parity, int8 plan (which products are int8), source model and
    architecture, one line each."""
    outputs = "; ".join(f"{o['name']} {o['dtype']} [{', '.join(map(str, o['shape']))}]" for o in info["outputs"] or [])
    src, arch = info.get("source") or {}, info.get("architecture") or {}
    lstm, cnn = arch.get("lstm", {}), arch.get("char_cnn", {})
    print(f"{indent}precision    {info['precision']}")
    print(f"{indent}outputs      {outputs}")
    print(f"{indent}parity       {parity_line(info.get('parity') or {})}")
    if info.get("int8_plan"):
        print(f"{indent}int8 plan    {info['int8_plan']}")
    print(f"{indent}source       {src.get('options')}  +  {src.get('weights')} ({src.get('format')}), weights sha256 "
          f"{src.get('weights_sha256')}")
    print(f"{indent}architecture biLSTM {lstm.get('n_layers')} layers, cell {lstm.get('dim')}, projection "
          f"{lstm.get('projection_dim')}; char CNN filters {cnn.get('filters')}, {cnn.get('n_highway')} highway")


def parity_line(p: dict[str, Any]) -> str:
    """An export's parity record on one line."""
    if not p.get("passed"):
        return f"not checked: {p.get('note')}" if "note" in p else f"failed: {value_text(p)}"
    tolerance = value_text({k: v for k, v in (p.get("tolerance") or {}).items() if v is not None})
    return (f"passed against {p.get('against')} on {len(p.get('shapes', []))} shapes: max |diff| "
            f"{p.get('max_abs', float('nan')):.2e}, min token cosine {p.get('min_cosine', float('nan')):.6f} "
            f"(tolerance {tolerance})")
