"""Every call that only a classic (py4j) SparkSession has, with its Spark Connect counterpart.

lakescore runs unchanged in a classic session (local, spark-submit, a Databricks dedicated
cluster) and in a Spark Connect session (``--remote sc://host:port``, ``SPARK_REMOTE``,
Databricks serverless or shared clusters). Connect sessions have no ``SparkContext``: no
``_jvm``/``_jsc``, no ``.rdd``, no accumulators, no ``statusTracker``, no Hadoop ``FileSystem``.
This module is the only place that touches them; the rest of lakescore asks it.

What each feature is over Connect:

========================  ==========================================  ==============================================
feature                   classic                                     Spark Connect
========================  ==========================================  ==============================================
default parallelism       ``SparkContext.defaultParallelism``         partitions of ``spark.range`` (one tiny job,
                                                                      cached per session)
input partitions          ``df.rdd.getNumPartitions()``               unknown (``None``): callers repartition
aggregates of a write     ``Observation`` on the written DataFrame    none (callers aggregate in a job of their own)
live rows while scoring   an accumulator the workers add to           none (tasks only, see :func:`stage_progress`)
tasks while scoring       ``statusTracker``                           ``registerProgressHandler``
path exists               Hadoop ``FileSystem.exists``                reading it with Spark (``binaryFile``)
delete a directory        Hadoop ``FileSystem.delete``                impossible: :class:`NotOnConnect` (callers stage
                                                                      into tables instead, checked before compute)
remote model files        Hadoop ``FileSystem`` copy + ``addFile``    ``binaryFile`` rows copied to the client, shipped
                                                                      by the caller with ``addArtifacts``
JVM log levels            ``setLogLevel`` / log4j via py4j            the server's own (nothing to do)
an error's Java causes    ``Throwable.getCause()`` via py4j           the error's text (``Caused by:`` lines)
can a path be written     create and delete a file there (Hadoop      unknown (``None``): the server's filesystem
                          ``FileSystem``)
a jar of lakescore's      ``ADD JAR`` (the driver's session and the   ``addArtifacts`` (the server's session and its
                          executors)                                  executors)
========================  ==========================================  ==============================================

Cancelling a Spark job from another thread: :func:`job_tag` / :func:`cancel_tagged` (``SparkContext`` job tags in
classic, the session's tags over Connect; see :func:`cancel_tagged` for why not the session's in classic). Worker
metrics for the report are the same in both (they travel in the scored rows, :mod:`lakescore.udfs.scoring_udf`).
"""

from __future__ import annotations

import logging
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from lakescore.jobs.config import ConfigError

__all__ = [
    "NotOnConnect",
    "one_row",
    "is_connect",
    "session_facts",
    "start_quiet_classic_jvm",
    "stop_classic_jvm",
    "default_parallelism",
    "observed",
    "partition_count",
    "rows_counter",
    "stage_progress",
    "set_log_level",
    "path_exists",
    "delete_path",
    "delete_path_if_empty",
    "child_names",
    "can_delete_paths",
    "is_delta_path",
    "delta_path_table",
    "delta_path_snapshot",
    "RemoteFiles",
    "remote_files",
    "job_tag",
    "cancel_tagged",
    "java_causes",
    "probe_write",
    "add_jar",
]

log = logging.getLogger(__name__)

BINARY_FILE_LIMIT = 2**31 - 1
"""The largest file Spark's ``binaryFile`` source reads into one row (bytes)."""


class NotOnConnect(ConfigError):
    """A feature the job was asked for cannot work over Spark Connect; raised before any compute."""


def is_connect(spark: SparkSession) -> bool:
    """True for a Spark Connect session (``pyspark.sql.connect``), false for a classic one."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


@contextmanager
def job_tag(spark: SparkSession, tag: str) -> Iterator[None]:
    """Tag the Spark jobs this thread starts inside the block with ``tag``, so that any thread can cancel them
    (:func:`cancel_tagged`)."""
    if is_connect(spark):
        spark.addTag(tag)
    else:
        spark.sparkContext.addJobTag(tag)
    try:
        yield
    finally:
        if is_connect(spark):
            spark.removeTag(tag)
        else:
            spark.sparkContext.removeJobTag(tag)


def cancel_tagged(spark: SparkSession, tag: str) -> None:
    """Cancel the running and queued jobs :func:`job_tag` tagged ``tag``, from any thread.

    Classic sessions use ``SparkContext``'s job tags: a classic ``SparkSession.addTag`` is stored per thread
    (``spark-session-<id>-thread-<id>-<tag>``), so ``interruptTag`` from another thread finds no job (Spark 4.1.1:
    a running ``mapInPandas`` job ran its 30 s to the end, ``interruptTag`` returned ``[]``, while
    ``cancelJobsWithTag`` ended it at once). Over Connect, tags travel with each operation and the server
    interrupts them whichever thread asks.
    """
    if is_connect(spark):
        spark.interruptTag(tag)
    else:
        spark.sparkContext.cancelJobsWithTag(tag)


def session_facts(spark: SparkSession) -> dict[str, str | None]:
    """``master``, ``app_id`` and ``mode`` (``classic`` / ``connect``) for logs and the run report.

    Read from the session's conf, which both kinds answer; a platform that hides a key (serverless) gives ``None``.
    """
    facts: dict[str, str | None] = {"mode": "connect" if is_connect(spark) else "classic"}
    for name, key in (("master", "spark.master"), ("app_id", "spark.app.id")):
        try:
            facts[name] = spark.conf.get(key, None)
        except Exception:  # serverless refuses some keys; the report says null
            facts[name] = None
    return facts


_parallelism: weakref.WeakKeyDictionary[SparkSession, int] = weakref.WeakKeyDictionary()


def one_row(frame: DataFrame) -> Row:
    """The row of a frame that holds exactly one (an aggregate without grouping, ``DESCRIBE DETAIL``); ``ValueError``
    when it holds none."""
    row = frame.first()
    if row is None:
        raise ValueError("expected one row, the frame holds none")
    return row


def _jvm(spark: SparkSession) -> Any:
    """The classic session's JVM view; ``RuntimeError`` once its context has stopped."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("the SparkContext has stopped: no JVM to call")
    return jvm


def default_parallelism(spark: SparkSession) -> int:
    """The cluster's default parallelism: how many tasks a stage gets when nobody says.

    Over Connect, the partitions of ``spark.range`` (Spark sizes it with
    ``spark.sql.leafNodeDefaultParallelism``, else the cluster's default parallelism): one
    sub-second job, once per session.
    """
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    if spark not in _parallelism:
        probe = one_row(spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).agg(F.max("p")))
        _parallelism[spark] = int(probe[0]) + 1
    return _parallelism[spark]


OBSERVED_WAIT_SECONDS = 5.0
"""How long :func:`observed`'s function waits, after the action, for Spark to hand over the aggregates."""


def observed(df: DataFrame, *aggregates: Any) -> tuple[DataFrame, Callable[[], dict[str, Any] | None]]:
    """``df`` carrying ``aggregates`` (named aggregate columns) that the action running it computes on the way (Spark's
    ``Observation``), and a function returning them, as a dict by name, once that action finished; or ``None``, and the
    caller aggregates in a job of its own.

    ``None`` over Spark Connect, where ``df`` is returned as it is: a Spark Connect 4.1.1 server given an observed Delta
    write waited for its metrics without end (seen here). ``None`` too when a classic session has not delivered them
    :data:`OBSERVED_WAIT_SECONDS` after the action (Spark's own ``Observation.get`` would wait forever): local Spark
    4.1.1 delivers them before the write returns, other runtimes' writers are not known to.
    """
    if is_connect(df.sparkSession):
        return df, lambda: None
    from pyspark.sql import Observation

    observation = Observation()

    def aggregated() -> dict[str, Any] | None:
        deadline = time.monotonic() + OBSERVED_WAIT_SECONDS
        try:
            jo = observation._jo
            if jo is None:
                raise RuntimeError("the Observation ran in no action")
            while not jo.future().isCompleted():  # the JVM Observation's promise, kept by a listener
                if time.monotonic() > deadline:
                    log.warning(
                        "Spark delivered no observed aggregates %.0f s after the action; counting again",
                        OBSERVED_WAIT_SECONDS,
                    )
                    return None
                time.sleep(0.01)
        except Exception:  # noqa: BLE001 (a runtime whose Observation has no such promise: count instead)
            log.debug("cannot tell whether Spark delivered the observed aggregates; counting again", exc_info=True)
            return None
        return observation.get

    return df.observe(observation, *aggregates), aggregated


def partition_count(df: DataFrame) -> int | None:
    """Partitions of ``df`` as planned (classic), or ``None`` over Connect, where only a job could tell."""
    return None if is_connect(df.sparkSession) else df.rdd.getNumPartitions()


def start_quiet_classic_jvm(settings: Mapping[str, str]) -> None:
    """Start the classic SparkContext of a session lakescore builds, with ``settings``, its JVM's stderr
    passing through :func:`lakescore.jobs.platform.spark.local.own_host.launch_quiet_gateway`'s filter; the session
    builder then picks that context up."""
    from pyspark import SparkConf, SparkContext

    from lakescore.jobs.platform.spark.local.own_host import launch_quiet_gateway

    conf = SparkConf().setAll(list(settings.items()))
    SparkContext(conf=conf, gateway=launch_quiet_gateway(conf))


def stop_classic_jvm(spark: SparkSession) -> None:
    """Stop a classic session this process built and wait until its JVM has exited (it runs its exit work,
    e.g. writing a class archive, first). The JVM exits when the gateway's stdin closes."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    assert gateway is not None  # a classic session runs on the gateway its context launched
    spark.stop()
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    if process is not None and process.stdin is not None:
        process.stdin.close()
        process.wait()


def rows_counter(spark: SparkSession) -> Any | None:
    """Something the scoring workers ``add(rows)`` to and the driver reads live (``.value``), or ``None``.

    Classic: an accumulator (merged on the driver as each task finishes). Connect has none; progress
    then counts tasks only.
    """
    return None if is_connect(spark) else spark.sparkContext.accumulator(0)


@contextmanager
def stage_progress(spark: SparkSession) -> Iterator[Callable[[], tuple[int, int]]]:
    """While the block runs, a function returning ``(tasks done, tasks)`` of the stages running now.

    Classic: the ``statusTracker``. Connect: the server's progress reports, through a handler
    registered for the block (``SparkSession.registerProgressHandler``) and removed after it.
    """
    if not is_connect(spark):
        tracker = spark.sparkContext.statusTracker()

        def classic() -> tuple[int, int]:
            infos = [i for i in (tracker.getStageInfo(s) for s in tracker.getActiveStageIds()) if i is not None]
            return sum(i.numCompletedTasks for i in infos), sum(i.numTasks for i in infos)

        yield classic
        return
    latest = {"tasks": (0, 0)}

    def handler(stages=None, inflight_tasks=0, operation_id=None, done=False, **_) -> None:
        running = [s for s in stages or () if not s.done]
        latest["tasks"] = (sum(s.num_completed_tasks for s in running), sum(s.num_tasks for s in running))

    spark.registerProgressHandler(handler)
    try:
        yield lambda: latest["tasks"]
    finally:
        spark.removeProgressHandler(handler)


def set_log_level(spark: SparkSession, level: str, quiet_loggers: tuple[str, ...] = ()) -> None:
    """Set the JVM log level of a session lakescore built, and ``ERROR`` for ``quiet_loggers``.

    Connect sessions log on the server, under its own configuration: nothing to do. Lowering a
    logger never fails a job (logging cosmetics only).
    """
    if is_connect(spark):
        return
    spark.sparkContext.setLogLevel(level.upper())
    try:
        jvm = _jvm(spark)
        for name in quiet_loggers:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
                name, jvm.org.apache.logging.log4j.Level.ERROR
            )
    except Exception:
        log.debug("could not lower the log level of %s", quiet_loggers, exc_info=True)


def _hadoop_path(spark: SparkSession, ref: str):
    """``(FileSystem, Path)`` for ``ref`` with the session's Hadoop configuration (classic only)."""
    path = _jvm(spark).org.apache.hadoop.fs.Path(ref)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def path_exists(spark: SparkSession, ref: str) -> bool:
    """Whether the file or directory ``ref`` exists (any filesystem Spark can read).

    Over Connect Spark resolves it as a ``binaryFile`` source: a missing path fails analysis
    with ``PATH_NOT_FOUND``; anything else that exists resolves.
    """
    if not is_connect(spark):
        fs, path = _hadoop_path(spark, ref)
        return bool(fs.exists(path))
    from pyspark.errors import AnalysisException

    try:
        spark.read.format("binaryFile").load(ref).schema  # noqa: B018 (resolving the schema lists the path)
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc):
            return False
        raise
    return True


JAVA_CAUSES_LIMIT = 32
"""At most this many Java causes are read (a cause chain can loop back on itself)."""


def java_causes(exc: BaseException) -> list[str]:
    """``Throwable.toString()`` of the Java exception behind ``exc`` and of each of its causes, outermost first:
    ``[]`` when ``exc`` carries none (raised in Python, or over Connect, where only its text came back) or the
    JVM can no longer be asked (callers read ``exc``'s text instead)."""
    throwable = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)  # Py4JJavaError / pyspark's
    causes: list[str] = []
    try:
        while throwable is not None and len(causes) < JAVA_CAUSES_LIMIT:
            causes.append(str(throwable.toString()))
            throwable = throwable.getCause()
    except Exception:  # noqa: BLE001 (the JVM is gone, or this is no Throwable: the text is all there is)
        return []
    return causes


OBJECT_STORES = frozenset({"s3a", "s3", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss", "cosn", "obs"})
"""Filesystem schemes whose directories are key prefixes: write permission is granted per prefix, so the probe
goes under the target itself, not under the nearest existing "directory" (the bucket root, for a new output)."""


def probe_write(spark: SparkSession, ref: str) -> str | None:
    """Create and delete an empty file in the directory a write to ``ref`` starts in: ``ref`` itself when it is
    a directory or on an object store (:data:`OBJECT_STORES`), else its nearest existing parent directory (where the
    writer makes its own). Returns that directory; ``None`` over Connect, where the server's filesystem cannot be
    asked. Raises what the filesystem raised (no permission, a read-only or full filesystem).

    Nothing is left behind, and no directory is made, except an object store's empty marker for ``ref``, which an
    output check takes for a missing output.
    """
    if is_connect(spark):
        return None
    fs, path = _hadoop_path(spark, ref)
    while fs.getScheme().lower() not in OBJECT_STORES and not fs.isDirectory(path):
        parent = path.getParent()
        if parent is None or parent.equals(path):  # the root, or a relative path's "."
            break
        path = parent
    probe = _jvm(spark).org.apache.hadoop.fs.Path(path, f".lakescore-write-probe-{uuid.uuid4().hex[:12]}")
    fs.create(probe, False).close()
    fs.delete(probe, False)
    return str(path)


def is_delta_path(spark: SparkSession, ref: str) -> bool | None:
    """Whether the directory ``ref`` holds a Delta table, from its ``_delta_log`` (Delta's ``isDeltaTable``); ``None``
    over Connect, where Delta's Python API needs the server's Delta Connect plugin: ask with SQL there.

    SQL names a path ``delta.`<path>```, which Spark first looks up as a table of a database ``delta`` in the
    metastore: the first such statement of a session starts the metastore client, which a run on paths needs for
    nothing else; this asks the filesystem instead.
    """
    if is_connect(spark):
        return None
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, ref))


def delta_path_table(spark: SparkSession, ref: str):
    """Delta's ``DeltaTable`` for the path ``ref``: its ``history()``, ``detail()`` and ``merge()`` run what
    ``DESCRIBE HISTORY`` / ``DETAIL`` / ``MERGE INTO`` do without the metastore lookup SQL makes
    (:func:`is_delta_path`); ``None`` over Connect, where that API needs the server's Delta Connect plugin."""
    if is_connect(spark):
        return None
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, ref)


def delta_path_snapshot(spark: SparkSession, ref: str) -> tuple[int, str] | None:
    """The latest version of the Delta table at the path ``ref`` and its table id (Delta's ``metaData.id``), from the
    log's latest snapshot on the driver: a listing of its log, no Spark job. ``None`` over Connect, where only
    ``DESCRIBE HISTORY`` and ``DESCRIBE DETAIL`` (each a Spark job) tell them, and where this Delta build's log API
    does not answer."""
    table = delta_path_table(spark, ref)
    if table is None:
        return None
    # DeltaLog is Delta's internal Scala API, whose signature differs between Delta builds (a vendor runtime's
    # included): where this build's does not answer, the caller asks with SQL, as over Connect.
    from py4j.protocol import Py4JError  # a classic session's bridge: imported where one is in use

    try:
        delta_log = table._jdt.deltaLog()
        # Scala's update(stalenessAcceptable, checkIfUpdatedSinceTs, catalogTableOpt), at its own defaults
        snapshot = delta_log.update(*(getattr(delta_log, f"update$default${i}")() for i in (1, 2, 3)))
        return int(snapshot.version()), str(snapshot.metadata().id())
    except Py4JError:
        log.debug("Delta's log API did not answer for %s; reading its history instead", ref, exc_info=True)
        return None


def can_delete_paths(spark: SparkSession) -> bool:
    """Whether :func:`delete_path` works in this session (classic: yes; Connect: no Spark API deletes files)."""
    return not is_connect(spark)


def delete_path(spark: SparkSession, ref: str) -> bool:
    """Delete the directory ``ref`` recursively; True if something was deleted.

    Raises :class:`NotOnConnect` over Connect: check :func:`can_delete_paths` before any compute.
    """
    if is_connect(spark):
        raise NotOnConnect(f"cannot delete {ref!r} over Spark Connect: no Spark API deletes files")
    fs, path = _hadoop_path(spark, ref)
    return bool(fs.exists(path) and fs.delete(path, True))


def delete_path_if_empty(spark: SparkSession, ref: str) -> bool:
    """Delete the directory ``ref`` if it exists and is empty; True if it was deleted (Connect: never)."""
    if is_connect(spark):
        return False
    fs, path = _hadoop_path(spark, ref)
    return bool(fs.exists(path) and len(fs.listStatus(path)) == 0 and fs.delete(path, False))


def child_names(spark: SparkSession, ref: str) -> list[str] | None:
    """The names of the entries directly under the directory ``ref``; ``None`` over Connect (no listing API)."""
    if is_connect(spark):
        return None
    fs, path = _hadoop_path(spark, ref)
    return [status.getPath().getName() for status in fs.listStatus(path)]


class RemoteFiles:
    """A file or directory on a filesystem Spark can read (``s3a://``, ``dbfs:/``, ``file:/``...), seen from the driver.

    Classic: the Hadoop ``FileSystem`` of the session (its credentials and connectors), and
    :meth:`ship_source` makes the executors fetch ``uri`` themselves (``addFile``; Spark's fetch
    cache copies once per host). Connect: Spark reads the files as ``binaryFile`` rows (at most
    2 GiB each) and :meth:`ship_source` is ``False``: the caller ships its local copy.
    """

    def __init__(self, spark: SparkSession, uri: str) -> None:
        self._spark, self._uri = spark, uri
        self._connect = is_connect(spark)

    def listing(self) -> list[tuple[str, int, int]]:
        """``(path, bytes, modified ms)`` of every file under the URI; ``FileNotFoundError`` when there is none."""
        if self._connect:
            from pyspark.errors import AnalysisException

            try:
                rows = self._binary_files().select("path", "length", "modificationTime").collect()
            except AnalysisException as exc:
                if "PATH_NOT_FOUND" in str(exc):
                    raise FileNotFoundError(self._uri) from exc
                raise
            entries = [(r[0], int(r[1]), int(r[2].timestamp() * 1000)) for r in rows]
        else:
            entries = self._hadoop_listing()
        if not entries:
            raise FileNotFoundError(self._uri)
        return sorted(entries)

    def copy_to(self, target: Path) -> None:
        """Copy the files to ``target`` (a directory's files below it; a single file as ``target`` itself)."""
        if not self._connect:
            fs, path = _hadoop_path(self._spark, self._uri)
            fs.copyToLocalFile(False, path, _jvm(self._spark).org.apache.hadoop.fs.Path(str(target)), True)
            return
        too_big = [(p, n) for p, n, _ in self.listing() if n > BINARY_FILE_LIMIT]
        if too_big:
            raise NotOnConnect(
                f"{too_big[0][0]} holds {too_big[0][1]} bytes; over Spark Connect a model file can be "
                f"copied only up to {BINARY_FILE_LIMIT} bytes (binaryFile): put the model on a local "
                "or mounted path (e.g. a Unity Catalog volume) or in MLflow"
            )
        root = urlparse(self._uri).path.rstrip("/")
        for row in self._binary_files().select("path", "content").toLocalIterator():
            relative = urlparse(row[0]).path[len(root) :].lstrip("/")
            destination = target / relative if relative else target
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(bytes(row[1]))

    def ship_source(self) -> bool:
        """Make executors fetch the URI themselves (classic ``addFile``); ``False`` when the caller must ship a copy."""
        if self._connect:
            return False
        fs, path = _hadoop_path(self._spark, self._uri)
        self._spark.sparkContext.addFile(self._uri, recursive=fs.getFileStatus(path).isDirectory())
        return True

    def _binary_files(self) -> DataFrame:
        return self._spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(self._uri)

    def _hadoop_listing(self) -> list[tuple[str, int, int]]:
        fs, path = _hadoop_path(self._spark, self._uri)
        if not fs.exists(path):
            return []
        files, entries = fs.listFiles(path, True), []
        while files.hasNext():
            status = files.next()
            entries.append((status.getPath().toString(), status.getLen(), status.getModificationTime()))
        return entries


def remote_files(spark: SparkSession, uri: str) -> RemoteFiles:
    """The files at ``uri`` as this session can reach them (:class:`RemoteFiles`)."""
    return RemoteFiles(spark, uri)


def add_jar(spark: SparkSession, jar: Path) -> None:
    """Put the local file ``jar`` on the classpath of ``spark``'s functions, on the driver and the executors."""
    if is_connect(spark):
        spark.addArtifacts(str(jar))
    else:  # addArtifacts in a classic session leaves the driver's class loader, which registers functions, without it
        quoted = str(jar).replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(f"ADD JAR '{quoted}'")


@contextmanager
def reused(df: DataFrame) -> Iterator[DataFrame]:
    """``df`` kept where its partitions are computed (executor memory, spilling to local disk) for the ``with`` block,
    so a frame read several times (a provider batch's rendered lines) is computed once; where the platform keeps
    nothing (Databricks serverless refuses ``persist``), ``df`` itself, computed again at each use."""
    from pyspark import StorageLevel

    try:
        kept = df.persist(StorageLevel.MEMORY_AND_DISK)
    except Exception:  # noqa: BLE001 (a platform without a cache: the frame as it is, lazily recomputed)
        log.info("the platform keeps no cached frame: a frame read several times is computed at each read")
        yield df
        return
    try:
        yield kept
    finally:
        kept.unpersist()
