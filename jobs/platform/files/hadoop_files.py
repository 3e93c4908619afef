"""The path column's file reader: a Java function reading each path's file on the executors through the Hadoop
filesystem of its scheme (``s3a://``, ``dbfs:/``, ``file:``, ``hdfs://``, ...; a path without one: ``fs.defaultFS``'s,
the local filesystem in local mode), with the executors' Hadoop settings (``spark.hadoop.*``) and credentials.

The function (``lakescore.HadoopFileBytes``, its source in ``java/``), and its companion giving each file's length and
modification time without reading it (``lakescore.HadoopFileStatus``), ship compiled in :data:`JAR` (``make jar``),
so installing lakescore needs no JDK. :func:`file_functions` registers both in a session, adding the jar to the
session (:func:`~lakescore.jobs.platform.spark.adapter.add_jar`) unless the session has the class already. Added to
the running session, not to ``spark.jars`` at start: that works in every session, those lakescore does not build too
(a notebook, spark-submit, Databricks, Spark Connect), and leaves a built driver's classpath, and so its class
archive (:mod:`~lakescore.jobs.platform.spark.local.class_archive`), as it was. :func:`file_bytes` and
:func:`file_status` are the two as columns, read by Python on the executors where a Spark Connect server refuses the
jar.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pyspark.errors import AnalysisException
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from lakescore.jobs.platform.spark.adapter import add_jar, is_connect

__all__ = [
    "FUNCTION",
    "JAVA_CLASS",
    "STATUS_FUNCTION",
    "STATUS_CLASS",
    "FILE_STATUS",
    "JAR",
    "file_functions",
    "file_bytes",
    "file_status",
]

log = logging.getLogger(__name__)

FUNCTION = "lakescore_file_bytes"
"""The SQL name the reader is registered under."""
JAVA_CLASS = "lakescore.HadoopFileBytes"
STATUS_FUNCTION = "lakescore_file_status"
"""The SQL name the file status function is registered under."""
STATUS_CLASS = "lakescore.HadoopFileStatus"
FILE_STATUS = StructType([StructField("length", LongType()), StructField("modified", LongType())])
"""What the status function returns: the file's length in bytes and its modification time in milliseconds since the
epoch."""
JAR = Path(__file__).with_name("java") / "lakescore-hadoop-files.jar"
"""The compiled reader, package data; its manifest's ``Source-SHA256`` is the digest of the sources it was built
from."""


def file_functions(spark: SparkSession) -> bool:
    """Register the reader and the status function in ``spark``: ``lakescore_file_bytes(path)`` is the bytes of the
    file at ``path``, ``lakescore_file_status(path)`` its :data:`FILE_STATUS` (the file is not read); each null for a
    null path, a missing file or a directory, and any other error fails the task with its message. ``False`` where a
    Spark Connect server refuses the jar (one that runs no JVM code of a user's)."""
    if all(spark.catalog.functionExists(name) for name in (FUNCTION, STATUS_FUNCTION)):
        return True  # registered by an earlier call in this session
    try:
        _register(spark)
        return True
    except AnalysisException:  # the class is not on the session's classpath (yet)
        pass
    try:
        add_jar(spark, JAR)
        _register(spark)
    except Exception as refused:
        if not is_connect(spark):
            raise
        log.warning(
            "the Spark Connect server does not take lakescore's file reader jar (%s); the paths are read by "
            "Python on the executors instead (local, file: and dbfs:/ paths only)",
            str(refused).splitlines()[0],
        )
        return False
    return True


def _register(spark: SparkSession) -> None:
    spark.udf.registerJavaFunction(FUNCTION, JAVA_CLASS, BinaryType())
    spark.udf.registerJavaFunction(STATUS_FUNCTION, STATUS_CLASS, FILE_STATUS)


def file_bytes(spark: SparkSession, path: Column, max_bytes: int) -> Column:
    """The bytes of the file ``path`` names, read on the executors by :func:`file_functions`' reader; null for a null
    path, a missing file or a directory."""
    return F.call_function(FUNCTION, path) if file_functions(spark) else _file_reader(max_bytes)(path)


def file_status(spark: SparkSession, path: Column) -> Column:
    """The :data:`FILE_STATUS` of the file ``path`` names, from its filesystem
    on the executors without reading it; null (or null fields) for a null path, a missing file or a directory."""
    return F.call_function(STATUS_FUNCTION, path) if file_functions(spark) else _status_reader()(path)


def _file_reader(max_bytes: int):
    """A pandas UDF: paths -> file bytes (local, ``file:`` and ``dbfs:/`` paths), each input batch returned in slices of
    at most ``max_bytes`` (Spark pairs an iterator UDF's output with its input row by row)."""
    from collections.abc import Iterator

    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    def read(batches):
        from lakescore.udfs.image_files import read_in_slices

        for paths in batches:
            for part in read_in_slices(paths.tolist(), max_bytes):
                yield pd.Series(part, dtype=object)

    read.__annotations__ = {
        "batches": Iterator[pd.Series],
        "return": Iterator[pd.Series],
    }  # the UDF's kind, for PySpark
    return pandas_udf(read, BinaryType())


def _status_reader():
    """A pandas UDF: paths -> :data:`FILE_STATUS` (local, ``file:`` and
    ``dbfs:/`` paths), null fields where there is no file."""
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    def stat(paths):
        from lakescore.udfs.image_files import file_status

        found = [file_status(path) for path in paths.tolist()]
        return pd.DataFrame(
            {
                name: pd.array([None if f is None else f[i] for f in found], dtype="Int64")
                for i, name in enumerate(FILE_STATUS.names)
            }
        )

    stat.__annotations__ = {"paths": pd.Series, "return": pd.DataFrame}  # the UDF's kind, for PySpark
    return pandas_udf(stat, FILE_STATUS)
