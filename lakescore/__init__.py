"""lakescore: batch model scoring of warehouse tables on Apache Spark.

Three entry points, each validating its settings before any Spark or model work:

* :func:`score` — the whole job (read, check, score, stage, validate, publish to Delta); returns the
  :class:`~lakescore.jobs.report.model.RunReport`. Same keys as the YAML config.
* :func:`transform` — a lazily scored DataFrame for notebooks (no write, no validation).
* :func:`pandas_udf` — an iterator-style pandas UDF for ``select`` / ``withColumn``.

Example::

    import lakescore
    scored = lakescore.transform(reviews, task="embed", model="/models/all-MiniLM-L6-v2", text_col="body")

The installed package is ``lakescore``; the repository's ``jobs/``, ``udfs/`` and ``schemas/``
folders are its subpackages ``lakescore.jobs`` (orchestration, CLI, platform adapters),
``lakescore.udfs`` (the model runtime, no Spark driver code) and ``lakescore.schemas``
(input contracts, output schemas, validation suites).
"""

from lakescore._version import __version__

__all__ = ["score", "transform", "pandas_udf", "__version__"]


def __getattr__(name: str):
    # The API imports pyspark: load it on first use, so `import lakescore` (and the CLI's
    # start-up) stay cheap.
    if name in ("score", "transform", "pandas_udf"):
        from lakescore.jobs import api

        return getattr(api, name)
    raise AttributeError(f"module 'lakescore' has no attribute {name!r}")
