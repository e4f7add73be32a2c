"""ELMo vectors inside a user's own Spark pipeline: ``elmo_vectors(df, model, ...)``.

    from pipelines.spark import elmo_vectors
    out = elmo_vectors(spark.read.parquet("s3://bucket/corpus"), "s3://bucket/models/elmo",
                       text_column="text", pool="mean")
    out.write.parquet("s3://bucket/vectors")

The DataFrame comes back with one more column (``output_column``, default ``elmo``) holding each
row's vectors as ``elmo embed`` computes them, with its options (``output``, ``pool``, ``mix``,
``gamma``, ``normalize``, ``dtype``, ``max_tokens_per_batch`` ...: the fields of
``pipelines.options.EmbedOptions``) and its run's (``precision``, ``device``, ``threads``, default 1:
a task's core ...: ``inference.run_settings.RunSettings``): ``mapInArrow`` hands each Arrow batch of rows
(``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 by default) to the one engine, which
batches them across rows by the token budget, and the model is loaded once per executor process
(``spark_worker.predictor_for``). A row without text (null) gets null; an empty text an empty list
(pooled: null). The vectors are Spark arrays of floats: ``array<array<float>>`` (T x D a row),
``array<float>`` pooled, one level more for ``output="all"``; float16 has no Spark type, so
``dtype`` is float32 here. Exactly-once output is the sink's business in a user's pipeline (a
transactional table format); ``elmo embed --engine spark`` writes through the commit protocol.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import pyarrow as pa

from elmo_core.errors import InputError
from inference.model_run import ModelRun, resolve_run
from inference.run_settings import RunSettings

from .options import EmbedOptions
from .schema import ELMO_COLUMN, elmo_type
from .spark_runner import session_cpu_flags
from .spark_worker import predictor_for


def spark_type(arrow: pa.DataType) -> pa.DataType:
    """The vectors' Arrow type as Spark takes it: fixed-size lists become lists (Spark has arrays only)."""
    if pa.types.is_list(arrow) or pa.types.is_fixed_size_list(arrow):
        return pa.list_(spark_type(arrow.value_type))
    return arrow


def elmo_vectors(df: Any, model: str, text_column: str = "text", output_column: str = ELMO_COLUMN,
                 **options: Any) -> Any:
    """``df`` with ``output_column`` added: each row's ELMo vectors (module doc). ``options``: the
    fields of ``EmbedOptions`` (``tokens_column`` reads a list of strings instead of text);
    InputError for options that do not apply here or a column that is missing or taken."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    settings, rest = RunSettings.split(options)
    opts = EmbedOptions.coerce(rest, text_column=text_column, engine="spark")
    if opts.vectors.dtype != "float32":
        raise InputError("dtype: Spark has no float16 type; the vectors are float32 here (write them as float16 "
                         "with elmo embed --dtype float16)")
    if opts.id_column or opts.keep_columns:
        raise InputError("id_column / keep_columns: every column of the DataFrame is kept as it is")
    source = opts.tokens_column or opts.text_column
    if source not in df.columns or output_column in df.columns:
        raise InputError(f"the DataFrame needs the column {source!r} and no column {output_column!r}; "
                         f"it has {df.columns}")
    flags = session_cpu_flags(df.sparkSession) if settings.auto_on_cpu else None  # an executor's CPU judges
    run = resolve_run(model, settings, job=True, remote=True, flags=flags)  # one thread a task (a core) unless threads
    config = run.config
    arrow = spark_type(elmo_type(config.output_dim, config.n_output_layers, opts.vectors))
    schema = StructType(df.schema.fields + [StructField(output_column, from_arrow_type(arrow), True)])
    run, opts = opts.settle(run)
    return df.mapInArrow(_add_vectors(run, opts.to_dict(), output_column, arrow), schema)


def _add_vectors(run: ModelRun, options: dict, column: str, arrow: pa.DataType
                 ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        predictor = predictor_for(run, options)
        for batch in batches:
            vectors = predictor(batch).column(ELMO_COLUMN).cast(arrow)  # (R,) in row order
            yield pa.RecordBatch.from_arrays([*batch.columns, vectors.combine_chunks()],
                                             names=[*batch.schema.names, column])
    return task
