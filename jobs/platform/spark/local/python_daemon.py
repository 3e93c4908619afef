"""The daemon Spark forks Python workers from, with the scoring runtime imported before the first fork.

Spark starts one Python daemon per executor (``spark.python.daemon.module``, default
``pyspark.daemon``) and forks every Python worker of that executor from it. A scoring worker's
first task imports torch and transformers' modelling stack, seconds of CPU paid again by every worker. Run as this
module instead, the daemon imports the modules named in :data:`IMPORTS_ENV` (comma-separated) once, then serves as
``pyspark.daemon`` does: each worker is forked with them already imported, so it only loads the weights, and the
imported modules' memory is shared copy-on-write between the workers instead of copied into each
(frozen out of the garbage collector's reach first, :func:`freeze_for_fork`).

Sessions lakescore builds set both on this host's own masters
(:func:`lakescore.jobs.platform.spark.local.own_host.worker_preload_confs`); the modules come from the task registry
(:meth:`lakescore.udfs.registry.Task.worker_imports`). A module that fails to import is reported on stderr and left out:
the worker imports it again where the failure reaches the run as a task error, as it would without this daemon.

Where Spark is pip's ``pyspark`` (local and local-cluster masters, ``make submit-local``), the daemon imports
pyspark from the installed package rather than from the ``pyspark.zip`` Spark puts first on the workers' path:
the same files, but a zip's modules are compiled from source in every daemon (:func:`installed_pyspark_first`).
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

__all__ = ["IMPORTS_ENV", "preload", "freeze_for_fork", "runs_daemon", "installed_pyspark_first"]

IMPORTS_ENV = "LAKESCORE_WORKER_IMPORTS"
"""The executor environment variable naming the modules to import before forking, comma-separated."""


def runs_daemon(argv: Sequence[str]) -> bool:
    """Whether a process with arguments ``argv`` (``/proc/<pid>/cmdline`` split at NULs) is this daemon or a
    worker forked from it: ``python -m lakescore.jobs.platform.spark.local.python_daemon ...``. The driver JVM's own
    command line names the module too, in its ``spark.python.daemon.module`` setting; that is not a match."""
    return any(argv[i] == "-m" and argv[i + 1] == __name__ for i in range(len(argv) - 1))


def preload(modules: Iterable[str]) -> list[str]:
    """Import ``modules`` in order; returns those imported. Never writes to stdout (the daemon's
    stdout tells the executor its port): anything a module prints, even from native code, goes to stderr."""
    imported = []
    sys.stdout.flush()
    stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        for name in (m.strip() for m in modules):
            if not name:
                continue
            try:
                importlib.import_module(name)
            except Exception as error:  # the worker's own import reports it, with the task
                print(
                    f"lakescore python daemon: could not preload {name}: {type(error).__name__}: {error}",
                    file=sys.stderr,
                )
            else:
                imported.append(name)
    finally:
        sys.stdout.flush()
        os.dup2(stdout, 1)
        os.close(stdout)
    return imported


def freeze_for_fork() -> None:
    """Collect garbage, then move every object now tracked to the collector's permanent generation
    (:func:`gc.freeze`): collections in the forked workers then never write to the preloaded objects'
    headers, which would copy their pages into each worker's private memory."""
    gc.collect()
    gc.freeze()


def installed_pyspark_first(path: Sequence[str]) -> list[str]:
    """``path`` (``sys.path``) without the ``pyspark.zip`` Spark puts first for its Python processes, when that zip
    is the one inside the installed ``pyspark`` package (pip's pyspark is its own ``SPARK_HOME``): the package's
    files are the same code with their bytecode compiled at install, while zipimport compiles a zip's modules from
    source in every process, about three times the CPU of the package's compiled files. A cluster's own Spark, whose zip
    lies elsewhere, keeps its zip first."""
    try:
        package = Path(metadata.distribution("pyspark").locate_file("pyspark"))
    except metadata.PackageNotFoundError:
        return list(path)
    own_zip = package / "python" / "lib" / "pyspark.zip"
    return [entry for entry in path if not (entry.endswith(".zip") and Path(entry).resolve() == own_zip.resolve())]


if __name__ == "__main__":
    sys.path[:] = installed_pyspark_first(sys.path)
    preload(os.environ.get(IMPORTS_ENV, "").split(","))
    freeze_for_fork()
    from pyspark import daemon

    daemon.manager()
