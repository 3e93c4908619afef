"""What a session lakescore builds on this host's own master gets on top, and nothing anywhere else.

``local``, ``local[…]`` and ``local-cluster[…]`` (:func:`own_host`) run every JVM and Python process of the job on this
host, started by lakescore for this one job, so lakescore tunes them for short runs:

* the driver JVM starts from the host's class-data-sharing archive
  (:mod:`~lakescore.jobs.platform.spark.local.class_archive`),
  with C1-only JIT and, on small heaps, the serial collector (:func:`local_java_options`); a ``local-cluster``'s
  executor JVMs run C1-only too;
* Delta rebuilds table state with few tasks (:data:`OWN_HOST_DEFAULTS`);
* executors fork Python workers from a daemon that imported the scoring runtime first
  (:mod:`~lakescore.jobs.platform.spark.local.python_daemon`, :func:`worker_preload_confs`);
* the gateway JVM's stderr passes through a filter that drops one start-up notice (:func:`launch_quiet_gateway`);
* the driver imports what the run's last steps need in the background (:func:`import_late_modules_meanwhile`), and
  the process ends without a last garbage collection (:func:`spare_the_exit_collection`).

Never on ``spark://``, ``yarn``, ``k8s://``, Databricks, a spark-submit-provided or a Connect session: there the
cluster's own Spark runs as its operators configured it (Spark documents ``spark.python.daemon.module`` as
experimental). Session building asks :func:`own_host_tuning` once and applies what it returns; the late imports
and the exit collection apply only after this process built such a session.
"""

from __future__ import annotations

import gc
import importlib
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from lakescore.jobs.config import SparkConfig, spark_size_mib
from lakescore.jobs.platform.spark.local import class_archive, python_daemon

__all__ = [
    "OwnHostTuning",
    "own_host_tuning",
    "own_host",
    "OWN_HOST_DEFAULTS",
    "LOCAL_MODE_JAVA_OPTIONS",
    "C1_CODE_CACHE_OPTION",
    "C1_ONLY_JAVA_OPTIONS",
    "local_java_options",
    "one_host_cluster_java_options",
    "worker_preload_confs",
    "launch_quiet_gateway",
    "JVM_NOISE",
    "import_late_modules_meanwhile",
    "spare_the_exit_collection",
]

log = logging.getLogger(__name__)

_built = {"own_host_session": False}


@dataclass(frozen=True)
class OwnHostTuning:
    """What a session lakescore builds gets on top of its own settings; empty for any master but this host's own."""

    defaults: dict[str, str] = field(default_factory=dict)
    """Settings that apply where the user's ``spark.conf`` has not set them."""
    confs: dict[str, str] = field(default_factory=dict)
    """Settings that apply over the user's (the worker preload's)."""
    driver_java_options: list[str] = field(default_factory=list)
    executor_java_options: list[str] = field(default_factory=list)
    quiet_gateway: bool = False
    """Start the gateway JVM through :func:`launch_quiet_gateway` (when not verbose)."""


def own_host_tuning(cfg: SparkConfig, confs: Mapping[str, str], worker_imports: Sequence[str] = ()) -> OwnHostTuning:
    """The tuning for a session built from ``cfg`` whose settings so far are ``confs`` (jars included: the
    class archive is per classpath) and whose Python workers import ``worker_imports``: none unless ``cfg.master``
    is this host's own (:func:`own_host`)."""
    if not own_host(cfg.master):
        return OwnHostTuning()
    _built["own_host_session"] = True
    local = not cfg.master.startswith("local-cluster[")
    driver = (
        local_java_options(confs.get("spark.driver.memory", "1g"), confs.get("spark.driver.extraJavaOptions", ""))
        if local
        else []
    )
    driver += one_host_cluster_java_options(cfg.master)
    if cfg.class_archive:
        driver += class_archive.start_options(cfg.jars_dir, confs)
    return OwnHostTuning(
        defaults=dict(OWN_HOST_DEFAULTS),
        confs=worker_preload_confs(cfg, worker_imports),
        driver_java_options=driver,
        executor_java_options=one_host_cluster_java_options(cfg.master),
        quiet_gateway=True,
    )


OWN_HOST_DEFAULTS = {
    # Delta rebuilds table state with this many tasks (default 50, sized for big logs); on this host's cores every
    # rebuild of a small log paid for each of them, in a local-cluster's executors as in a local driver (BENCHMARKS.md).
    "spark.databricks.delta.snapshotPartitions": "2",
}
"""Settings for this host's own masters (``local[...]`` and ``local-cluster[...]``) that the user's ``spark.conf``
has not set."""

LOCAL_MODE_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
"""Local jobs live seconds to minutes: C1-only JIT compiles sooner than C2 would pay off, while the heavy lifting
happens in Python workers. ``local-cluster[...]`` (Spark's
one-host test cluster: its driver and executor JVMs share this host's cores) gets it too, in every JVM.
Clusters keep full JIT."""

C1_CODE_CACHE_OPTION = "-XX:ReservedCodeCacheSize=240m"
"""A C1-only JVM reserves a client VM's 48 MiB of code cache, which a session that lives for many runs (a notebook's, a
test process's) fills with its queries' compiled code: the JVM then turns its JIT off and runs every later query
interpreted. The tiered JVM's own default is reserved instead (committed only as it fills)."""

C1_ONLY_JAVA_OPTIONS = (LOCAL_MODE_JAVA_OPTIONS, C1_CODE_CACHE_OPTION)
"""What every C1-only JVM lakescore starts gets: the JIT and its code cache."""

SERIAL_GC_MAX_HEAP_MIB = 4096
"""Local drivers with at most this heap collect with the serial collector (see :func:`local_java_options`)."""

_COLLECTOR_OPTION = re.compile(r"-XX:\+Use\w+GC\b")


def local_java_options(driver_memory: str, user_options: str) -> list[str]:
    """Java options lakescore adds to a ``local[...]`` driver whose heap is ``driver_memory``
    (``spark.driver.memory``, e.g. ``1g``; a bare number is MiB, as Spark reads it) and whose
    ``spark.driver.extraJavaOptions`` are ``user_options``.

    Always C1-only JIT with its code cache (:data:`C1_ONLY_JAVA_OPTIONS`). The serial collector too when the
    heap is at most :data:`SERIAL_GC_MAX_HEAP_MIB` and ``user_options`` choose no collector
    (the JVM refuses two): the driver peaks lower resident than with G1, the JVM's default, at the
    same wall time (BENCHMARKS.md); its longer pauses cost less than G1's concurrent work on the
    same cores. Larger local heaps keep G1, which is built to keep pauses short on large heaps. A ``driver_memory`` that
    is not a size keeps G1 too (Spark names the mistake when it starts).
    """
    options = list(C1_ONLY_JAVA_OPTIONS)
    heap_mib = spark_size_mib(driver_memory)
    if heap_mib is not None and heap_mib <= SERIAL_GC_MAX_HEAP_MIB and not _COLLECTOR_OPTION.search(user_options):
        options.append("-XX:+UseSerialGC")
    return options


def one_host_cluster_java_options(master: str) -> list[str]:
    """Java options for every JVM of a ``local-cluster[...]`` master, driver and executors: C1-only JIT
    (:data:`C1_ONLY_JAVA_OPTIONS`); none for any other master (``local[...]`` drivers get
    :func:`local_java_options`)."""
    return list(C1_ONLY_JAVA_OPTIONS) if master.startswith("local-cluster[") else []


def own_host(master: str) -> bool:
    """Whether ``master`` runs every JVM on this host, started by lakescore: ``local``, ``local[...]`` or
    ``local-cluster[...]``; not ``spark://``, ``yarn``, ``k8s://`` or any other cluster's."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def worker_preload_confs(cfg: SparkConfig, worker_imports: Sequence[str]) -> dict[str, str]:
    """The settings that make executors fork Python workers from
    :mod:`~lakescore.jobs.platform.spark.local.python_daemon` with ``worker_imports`` imported; none when there is
    nothing to import, ``cfg.worker_preload`` is off, ``cfg.conf`` names its own daemon module or the master is not this
    host's own (:func:`own_host`)."""
    if (
        not worker_imports
        or not cfg.worker_preload
        or "spark.python.daemon.module" in cfg.conf
        or not own_host(cfg.master)
    ):
        return {}
    return {
        "spark.python.daemon.module": python_daemon.__name__,
        f"spark.executorEnv.{python_daemon.IMPORTS_ENV}": ",".join(worker_imports),
    }


JVM_NOISE = (b"WARNING: Using incubator modules:",)
"""Starts of JVM stderr lines that log4j cannot silence and no run needs."""


def launch_quiet_gateway(conf):
    """Start the Py4J gateway JVM for ``conf`` (a ``SparkConf``) with :data:`JVM_NOISE` dropped from its stderr.

    Every other line the JVM (or a Python worker it forks) writes to stderr is copied, as
    it comes, to this process's current ``sys.stderr`` by a daemon thread, but a Python worker's warning
    (:data:`~lakescore.jobs.platform.spark.console.PYTHON_WARNING`), which goes to the run's log file where there is
    one.
    """
    from pyspark.java_gateway import launch_gateway

    popen = {"stderr": subprocess.PIPE}
    gateway = launch_gateway(conf, popen_kwargs=popen)
    process = getattr(gateway, "proc", None)
    if process is not None and process.stderr is not None:
        threading.Thread(target=_copy_stderr, args=(process.stderr,), name="lakescore-jvm-stderr", daemon=True).start()
    return gateway


def _copy_stderr(source: IO[bytes]) -> None:
    from lakescore.jobs.platform.spark.console import PYTHON_WARNING, to_run_log

    warning = False  # inside a Python worker's warning: its first line, then its indented source lines
    for line in iter(source.readline, b""):
        if line.startswith(JVM_NOISE):
            continue
        warning = bool(PYTHON_WARNING.match(line)) or (warning and line.startswith(b"  "))
        if warning and to_run_log(line.decode("utf-8", "replace")):  # a library's warning: the log, not the console
            continue
        try:
            sys.stderr.write(line.decode("utf-8", "replace"))
            sys.stderr.flush()
        except (ValueError, OSError):  # stderr closed at interpreter exit
            return


def import_late_modules_meanwhile(modules: Sequence[str]) -> None:
    """Import ``modules`` (what the run's last steps need) in a background thread, after this process built a
    session on this host's own master; otherwise nothing: each step imports what it needs when it runs.

    Called once the input is open, not at the JVM's start: there the imports competed with the executors' Python
    daemon importing the scoring runtime, which is on the run's path. Not at the lowest CPU priority either: a
    validation step waiting on a starved import could stall."""
    if modules and _built["own_host_session"]:
        threading.Thread(target=_import_all, args=(list(modules),), name="lakescore-late-imports", daemon=True).start()


def _import_all(modules: list[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 (the step that needs the module imports it again and reports why it failed)
            log.debug("importing %s ahead of time failed", name, exc_info=True)


def spare_the_exit_collection() -> None:
    """The process ends next: after this process built a session on this host's own master, keep the interpreter's
    last cyclic garbage collection off everything still loaded (GX's, pandas', matplotlib's modules).

    ``gc.freeze`` moves the objects alive now out of the collector's reach; atexit handlers, stream flushes and
    reference-counted finalizers still run, and the operating system takes the memory back as the process ends."""
    if _built["own_host_session"]:
        gc.freeze()
