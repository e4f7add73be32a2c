"""Typed errors of the file formats (the CLI maps every ElmoError to exit code 2)."""
from __future__ import annotations

from elmo_core.errors import ElmoError


class ExportError(ElmoError):
    """An export that cannot be built, written or read back (bad spec, manifest or graph), or a
    backend run on one that fails."""
