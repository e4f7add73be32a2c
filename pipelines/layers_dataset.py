"""A PyTorch dataset over a finished ``elmo embed --output all`` output, so a task model learns its
scalar mixes (``inference.ElmoMix``) from precomputed layers without rerunning the biLM.

Rows come in the manifest's order (input files in order, each file's rows in input order). A
null text gives a row with zero tokens. Random access reads one row group (about 16 MiB of
rows: ``shard_files.ROW_GROUP_BYTES``) and keeps the last ``cached_row_groups`` of them: iterate
in order, or shuffle within row groups, for speed.
"""
from __future__ import annotations

import bisect
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from elmo_core.errors import InputError
from elmo_core.kinds import OutputMode

from .errors import OutputDirError
from .schema import ELMO_COLUMN
from .output_dir import LocalDir
from .sink import SUCCESS_FILE, side_names


class ElmoLayersDataset(Dataset):
    """Item i: ``{"layers": (L+1, T_i, D) float32 tensor, <each passed-through column>: value}``.

    ``columns``: the passed-through columns to return (default: all of them).
    Shape: item layers (L+1, T, D); see ``collate_layers`` for batches.
    """

    def __init__(self, output_dir: str | Path, columns: Sequence[str] | None = None, cached_row_groups: int = 2) -> None:
        self.out = Path(output_dir)
        manifest = _finished_manifest(self.out)
        opts = manifest["options"]
        if not OutputMode.of(opts.get("output", "mixed")).layer_axis or opts.get("pool"):
            raise OutputDirError(f"{self.out}: written with --output {opts.get('output')}"
                                 f"{' --pool ' + opts['pool'] if opts.get('pool') else ''}; the layers dataset needs "
                                 f"--output all without --pool (rerun elmo embed so)")
        self.files = [self.out / s["file"] for s in manifest["shards"]]
        self.groups: list[tuple[int, int]] = []  # (file, row group) in order
        self.starts = [0]  # row index where each group starts; the last is len(self)
        for f, path in enumerate(self.files):
            meta = pq.ParquetFile(path).metadata
            for g in range(meta.num_row_groups):
                self.groups.append((f, g))
                self.starts.append(self.starts[-1] + meta.row_group(g).num_rows)
        schema = pq.read_schema(self.files[0]) if self.files else None
        passthrough = [n for n in (schema.names if schema else []) if n != ELMO_COLUMN]
        unknown = sorted(set(columns or ()) - set(passthrough))
        if unknown:
            raise OutputDirError(f"{self.out}: no column {unknown} in the output (it has {passthrough})")
        self.columns = list(columns) if columns is not None else passthrough
        self.cache: OrderedDict[int, pa.Table] = OrderedDict()
        self.cached_row_groups = max(1, cached_row_groups)

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        index %= len(self)
        g = bisect.bisect_right(self.starts, index) - 1
        table = self._group(g)
        row = index - self.starts[g]
        item = {name: table.column(name)[row].as_py() for name in self.columns}
        item["layers"] = _row_layers(table.column(ELMO_COLUMN).combine_chunks(), row)  # (L+1, T, D)
        return item

    def _group(self, g: int) -> pa.Table:
        if g not in self.cache:
            f, rg = self.groups[g]
            self.cache[g] = pq.ParquetFile(self.files[f]).read_row_group(rg, columns=self.columns + [ELMO_COLUMN])
            while len(self.cache) > self.cached_row_groups:
                self.cache.popitem(last=False)
        self.cache.move_to_end(g)
        return self.cache[g]


def _row_layers(column: pa.Array, row: int) -> torch.Tensor:
    """Shape: row ``row`` of a ``list<fixed_size_list<fixed_size_list<float, D>, L+1>>`` column -> (L+1, T, D)."""
    per_token = column.type.value_type  # fixed_size_list<fixed_size_list<float, D>, L+1>
    n_layers, dim = per_token.list_size, per_token.value_type.list_size
    tokens = column[row].values  # (T,) tokens of L+1 layers, or None for a null row
    if tokens is None or len(tokens) == 0:
        return torch.zeros(n_layers, 0, dim)
    flat = tokens.flatten().flatten().to_numpy(zero_copy_only=False)  # (T*(L+1)*D,)
    return torch.from_numpy(flat.astype(np.float32, copy=False).reshape(-1, n_layers, dim).transpose(1, 0, 2).copy())


def collate_layers(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A batch for ``inference.ElmoMix``: layers zero-padded to the longest row, and the mask.

    Shape: B items -> layers (B, L+1, T_max, D), mask (B, T_max) bool; other keys as lists.
    """
    lengths = [item["layers"].shape[1] for item in items]
    n_layers, _, dim = items[0]["layers"].shape
    layers = torch.zeros(len(items), n_layers, max(lengths, default=0), dim)  # (B, L+1, T, D)
    for b, item in enumerate(items):
        layers[b, :, : lengths[b]] = item["layers"]
    mask = torch.arange(layers.shape[2])[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    out: dict[str, Any] = {k: [item[k] for item in items] for k in items[0] if k != "layers"}
    return {**out, "layers": layers, "mask": mask}


def _finished_manifest(out: Path) -> dict:
    found = LocalDir(out)
    names = side_names(found)
    if names is None or found.size(SUCCESS_FILE) is None:
        raise OutputDirError(f"{out}: no {SUCCESS_FILE}; not a finished elmo embed output (finish it with --resume)")
    try:
        return found.read_record(names[1])
    except (OSError, InputError) as e:
        raise OutputDirError(f"{out / names[1]}: unreadable ({e})") from None
