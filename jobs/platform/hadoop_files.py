"""The path column's file reader: a Java function reading each path's file on the executors through the Hadoop
filesystem of its scheme (``s3a://``, ``dbfs:/``, ``file:``, ``hdfs://``, ...; a path without one: ``fs.defaultFS``'s,
the local filesystem in local mode), with the executors' Hadoop settings (``spark.hadoop.*``) and credentials.

The function (``lakescore.HadoopFileBytes``, its source in ``java/``), and its companion giving each file's length and
modification time without reading it (``lakescore.HadoopFileStatus``), ship compiled in :data:`JAR` (``make jar``),
so installing lakescore needs no JDK. :func:`file_functions` registers both in a session, adding the jar to the
session (:func:`~lakescore.jobs.platform.spark_adapter.add_jar`) unless the session has the class already. Added to
the running session, not to ``spark.jars`` at start: that works in every session, those lakescore does not build too
(a notebook, spark-submit, Databricks, Spark Connect), and leaves a built driver's classpath, and so its class
archive (:mod:`~lakescore.jobs.platform.local.class_archive`), as it was.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from lakescore.jobs.platform.spark_adapter import add_jar, is_connect

__all__ = ["FUNCTION", "JAVA_CLASS", "STATUS_FUNCTION", "STATUS_CLASS", "FILE_STATUS", "JAR", "file_functions"]

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
"""The compiled reader, package data; its manifest's ``Source-SHA256`` is the digest of the sources it was built from."""


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
        log.warning("the Spark Connect server does not take lakescore's file reader jar (%s); the paths are read by "
                    "Python on the executors instead (local, file: and dbfs:/ paths only)", str(refused).splitlines()[0])
        return False
    return True


def _register(spark: SparkSession) -> None:
    spark.udf.registerJavaFunction(FUNCTION, JAVA_CLASS, BinaryType())
    spark.udf.registerJavaFunction(STATUS_FUNCTION, STATUS_CLASS, FILE_STATUS)
