"""The SparkSession a job runs in: taken when one exists, built from ``spark:`` config otherwise.

:func:`session_source` decides, from the process environment alone, who owns the
session. On Databricks, under ``spark-submit`` (EMR, ``make submit-local``) or
where a session is already active (a notebook, a test), the platform's session
is used as is: no jars added, no master or metastore set, nothing reconfigured,
never stopped here (``jobs/platform/launcher.py`` stops a spark-submit application's own
at exit). With ``spark.remote`` (``--remote sc://host:port``) or ``SPARK_REMOTE`` set, the
session is a Spark Connect client of that server, which owns jars, Delta and the metastore;
either kind runs the same job (:mod:`lakescore.jobs.platform.spark_adapter`). Built locally, the session has the Delta extension and catalog, a Hive
metastore in an embedded Derby database under ``spark.metastore_dir`` and
managed tables under ``spark.warehouse_dir``, so ``db.table`` names are real
metastore tables. For the CLI its driver JVM logs to ``logs/`` beside the metastore
(:func:`lakescore.jobs.platform.console.start_run_log`).
It gets the Hadoop S3A connector only when the job touches ``s3a://`` (or
``spark.s3a`` says so): its ~620 MiB of jars add seconds to every start and, in
local mode, are copied into each session's scratch directory.

Its driver JVM starts from the host's class-data-sharing archive for its classpath when
``lakescore fetch-jars`` built one (:mod:`lakescore.jobs.platform.class_archive`), and its executors fork
Python workers from a daemon that imported the job's model runtime first
(:mod:`lakescore.jobs.platform.python_daemon`).

Note: embedded Derby admits one process at a time per metastore directory;
concurrent local jobs need separate ``spark.metastore_dir`` values.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

from pyspark.sql import SparkSession

from lakescore.jobs.platform import class_archive, interrupts, python_daemon
from lakescore.jobs.config import SparkConfig, spark_size_mib
from lakescore.jobs.platform.console import is_verbose, quiet_java_options, start_run_log
from lakescore.jobs.platform.jars import cached_jars, delta_coordinate, s3a_coordinate
from lakescore.jobs.platform.spark_adapter import session_facts, set_log_level, start_quiet_classic_jvm

__all__ = [
    "get_or_create_session", "session_source", "needs_s3a", "jar_confs", "worker_preload_confs", "LOCAL_MODE_DEFAULTS",
    "local_java_options",
]

log = logging.getLogger(__name__)

LOCAL_MODE_DEFAULTS = {
    # Delta rebuilds table state with this many tasks (default 50, sized for big logs). A fresh
    # local process paid 16.3 s for its first Delta query at 50, 7.8 s at 1 (measured here).
    "spark.databricks.delta.snapshotPartitions": "2",
}
"""Settings for ``local[...]`` masters that the user's ``spark.conf`` has not set."""

LOCAL_MODE_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
"""Local jobs live seconds to minutes: C1-only JIT cut that first Delta query from 7.8 s to 4.8 s
(measured here), while the heavy lifting happens in Python workers. ``local-cluster[...]`` (Spark's
one-host test cluster: its driver and executor JVMs share this host's cores) gets it too, in every JVM.
Clusters keep full JIT."""

SERIAL_GC_MAX_HEAP_MIB = 4096
"""Local drivers with at most this heap collect with the serial collector (see :func:`local_java_options`)."""

_COLLECTOR_OPTION = re.compile(r"-XX:\+Use\w+GC\b")


def local_java_options(driver_memory: str, user_options: str) -> list[str]:
    """Java options lakescore adds to a ``local[...]`` driver whose heap is ``driver_memory``
    (``spark.driver.memory``, e.g. ``1g``; a bare number is MiB, as Spark reads it) and whose
    ``spark.driver.extraJavaOptions`` are ``user_options``.

    Always C1-only JIT (:data:`LOCAL_MODE_JAVA_OPTIONS`). The serial collector too when the
    heap is at most :data:`SERIAL_GC_MAX_HEAP_MIB` and ``user_options`` choose no collector
    (the JVM refuses two). Measured on a 2-core AMD EPYC, W1 with the ONNX int8 backend, 6 runs
    each: the driver JVM peaked at 643-849 MiB resident with it against 812-1238 MiB with G1,
    the JVM's default, at the same wall time (32.75 s vs 32.95 s median). Its stop-the-world
    pauses are longer (one run: 1.3 s in all, longest 142 ms, against G1's 0.6 s and 83 ms),
    but G1's concurrent work runs on the same cores. Larger local heaps keep G1, which is built
    to keep pauses short on large heaps. A ``driver_memory`` that is not a size keeps G1 too
    (Spark names the mistake when it starts).
    """
    options = [LOCAL_MODE_JAVA_OPTIONS]
    heap_mib = spark_size_mib(driver_memory)
    if heap_mib is not None and heap_mib <= SERIAL_GC_MAX_HEAP_MIB and not _COLLECTOR_OPTION.search(user_options):
        options.append("-XX:+UseSerialGC")
    return options


def one_host_cluster_java_options(master: str) -> list[str]:
    """Java options for every JVM of a ``local-cluster[...]`` master, driver and executors: C1-only JIT
    (:data:`LOCAL_MODE_JAVA_OPTIONS`); none for any other master (``local[...]`` drivers get
    :func:`local_java_options`)."""
    return [LOCAL_MODE_JAVA_OPTIONS] if master.startswith("local-cluster[") else []


def own_host(master: str) -> bool:
    """Whether ``master`` runs every JVM on this host, started by lakescore: ``local``, ``local[...]`` or
    ``local-cluster[...]``; not ``spark://``, ``yarn``, ``k8s://`` or any other cluster's."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def needs_s3a(cfg: SparkConfig, refs: Iterable[Optional[str]] = ()) -> bool:
    """Whether a session built from ``cfg`` gets the S3A connector: ``spark.s3a`` if set,
    else whether any of ``refs`` (the job's input and output) is an ``s3a://`` path."""
    if cfg.s3a is not None:
        return cfg.s3a
    return any(ref and ref.lower().startswith("s3a://") for ref in refs)


def session_source(environ: Mapping[str, str], has_active_session: bool, remote: Optional[str] = None) -> str:
    """Who owns the SparkSession, decided without touching Spark.

    - ``"connect"`` first when ``remote`` (``spark.remote``, ``--remote``) is given: said explicitly, it wins.
    - ``"active"``: a session is already active in this Python process: use it.
    - ``"databricks"``: ``DATABRICKS_RUNTIME_VERSION`` is set. The runtime's JVM holds
      the session even when Python has no *active* one yet (a ``python_wheel_task``):
      ``SparkSession.builder.getOrCreate()`` with no added config.
    - ``"spark-submit"``: ``PYSPARK_GATEWAY_PORT`` is set, so a JVM started this Python
      (``spark-submit``, EMR steps): master, jars, Delta and metastore settings come
      from the submit command and the cluster; ``getOrCreate()`` with no added config.
    - ``"connect"``: ``SPARK_REMOTE`` names a Spark Connect server: a client session of it, with no
      added config (the server owns it).
    - ``"build"``: nobody made one; lakescore builds a local session from ``spark:``.
    """
    if remote:
        return "connect"
    if has_active_session:
        return "active"
    if environ.get("DATABRICKS_RUNTIME_VERSION"):
        return "databricks"
    if environ.get("PYSPARK_GATEWAY_PORT"):
        return "spark-submit"
    if environ.get("SPARK_REMOTE"):
        return "connect"
    return "build"


def get_or_create_session(
    cfg: SparkConfig, refs: Iterable[Optional[str]] = (), worker_imports: Sequence[str] = ()
) -> tuple[SparkSession, bool]:
    """Return ``(spark, created)``; ``created`` tells the caller it owns (and may stop) the session.

    ``cfg`` is used only when :func:`session_source` says ``"build"`` (and ``cfg.remote`` for ``"connect"``). ``refs`` are the
    tables / paths the job reads and writes; a built session gets the S3A connector jars
    when :func:`needs_s3a` says so. Jars come from ``spark.jars_dir`` when fetched, else
    Spark resolves them from Maven at start-up (with a warning). A built session's Python daemon
    imports ``worker_imports`` before forking workers (:func:`worker_preload_confs`).
    """
    active = SparkSession.getActiveSession()
    source = session_source(os.environ, active is not None, cfg.remote)
    if source == "active":
        log.info("using the existing SparkSession (%s)", session_facts(active))
        return active, False
    if source in ("databricks", "spark-submit"):
        spark = SparkSession.builder.getOrCreate()
        log.info("using the %s SparkSession (%s)", source, session_facts(spark))
        return spark, False
    if source == "connect":
        builder = SparkSession.builder.remote(cfg.remote) if cfg.remote else SparkSession.builder
        spark = builder.getOrCreate()  # no remote given: pyspark reads SPARK_REMOTE itself
        log.info("using the Spark Connect session of %s (%s)", cfg.remote or os.environ["SPARK_REMOTE"], session_facts(spark))
        return spark, True

    # Python workers must start this interpreter, or pandas UDFs fail with ModuleNotFoundError.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    warehouse = Path(cfg.warehouse_dir).expanduser().resolve()
    metastore = Path(cfg.metastore_dir).expanduser().resolve() if cfg.metastore_dir else warehouse.parent / "metastore_db"
    metastore.parent.mkdir(parents=True, exist_ok=True)

    local = cfg.master.startswith("local[") or cfg.master == "local"
    verbose = is_verbose()
    driver_log, executor_log = quiet_java_options(cfg.master, verbose, start_run_log(metastore.parent / "logs"))
    confs = jar_confs(cfg, refs, {**(LOCAL_MODE_DEFAULTS if local else {}), **cfg.conf})
    confs.update(worker_preload_confs(cfg, worker_imports))
    user_java_options = confs.get("spark.driver.extraJavaOptions", "")
    java_options = [f"-Dderby.system.home={metastore.parent}"]
    if local:
        java_options += local_java_options(confs.get("spark.driver.memory", "1g"), user_java_options)
    java_options += one_host_cluster_java_options(cfg.master)
    if cfg.class_archive and own_host(cfg.master):
        java_options += class_archive.start_options(cfg.jars_dir, confs)
    confs["spark.driver.extraJavaOptions"] = _join(java_options + [driver_log, user_java_options])
    executor_options = [executor_log] + one_host_cluster_java_options(cfg.master)
    if any(executor_options):
        confs["spark.executor.extraJavaOptions"] = _join(executor_options + [confs.get("spark.executor.extraJavaOptions", "")])
    settings = {
        "spark.master": cfg.master,
        "spark.app.name": cfg.app_name,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.warehouse.dir": str(warehouse),
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={metastore};create=true",
        # Hive's session state otherwise leaves a /tmp/<uuid>_resources directory behind for every run.
        "spark.hadoop.hive.downloaded.resources.dir": str(metastore.parent / "hive_resources"),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.catalogImplementation": "hive",  # what enableHiveSupport() sets
        **confs,
    }
    if not verbose:  # the JVM starts here, its stderr passing through the console's filter
        start_quiet_classic_jvm(settings)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    interrupts.reinstall()  # PySpark's SparkContext just replaced the CLI's SIGINT handler
    # "Could not alter schema of table ... in a Hive compatible way" is expected for Delta tables (Hive has
    # no SerDe for them) and harmless, but HiveExternalCatalog logs ~100 lines of Java stack per overwrite.
    set_log_level(spark, cfg.log_level, quiet_loggers=("org.apache.spark.sql.hive.HiveExternalCatalog",))
    return spark, True


def jar_confs(cfg: SparkConfig, refs: Iterable[Optional[str]], confs: Mapping[str, str]) -> dict[str, str]:
    """``confs`` with the Delta (and, per :func:`needs_s3a`, S3A) jars put first on ``spark.jars``,
    or on ``spark.jars.packages`` for a coordinate not fetched into ``cfg.jars_dir`` yet."""
    wanted = [("Delta", delta_coordinate(), "lakescore fetch-jars")]
    if needs_s3a(cfg, refs):
        wanted.append(("S3A connector", s3a_coordinate(), "lakescore fetch-jars --s3a"))
    jars: list[str] = []
    packages: list[str] = []
    for name, coordinate, fetch in wanted:
        cached = cached_jars(cfg.jars_dir, coordinate)
        if cached:
            jars += [str(j) for j in cached]
        else:
            log.warning("%s jars not fetched yet (run `%s`); resolving %s from Maven", name, fetch, coordinate)
            packages.append(coordinate)
    out = dict(confs)
    for key, values in (("spark.jars", jars), ("spark.jars.packages", packages)):
        if values:
            out[key] = ",".join(values + ([out[key]] if out.get(key) else []))
    return out


def worker_preload_confs(cfg: SparkConfig, worker_imports: Sequence[str]) -> dict[str, str]:
    """The settings that make executors fork Python workers from :mod:`~lakescore.jobs.platform.python_daemon`
    with ``worker_imports`` imported; none when there is nothing to import, ``cfg.worker_preload`` is off,
    ``cfg.conf`` names its own daemon module or the master is not this host's own (:func:`own_host`)."""
    if not worker_imports or not cfg.worker_preload or "spark.python.daemon.module" in cfg.conf or not own_host(cfg.master):
        return {}
    return {
        "spark.python.daemon.module": python_daemon.__name__,
        f"spark.executorEnv.{python_daemon.IMPORTS_ENV}": ",".join(worker_imports),
    }


def _join(options: list[str]) -> str:
    return " ".join(o for o in options if o).strip()
