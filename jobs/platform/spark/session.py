"""The SparkSession a job runs in: taken when one exists, built from ``spark:`` config otherwise.

:func:`session_source` decides, from the process environment alone, who owns the
session. On Databricks, under ``spark-submit`` (EMR, ``make submit-local``) or
where a session is already active (a notebook, a test), the platform's session
is used as is: no jars added, no master or metastore set, nothing reconfigured,
never stopped here (``jobs/launcher.py`` stops a spark-submit application's own
at exit). With ``spark.remote`` (``--remote sc://host:port``) or ``SPARK_REMOTE`` set, the
session is a Spark Connect client of that server, which owns jars, Delta and the metastore;
either kind runs the same job (:mod:`lakescore.jobs.platform.spark.adapter`). Built locally, the session has the Delta
extension and catalog, a Hive metastore in an embedded Derby database under ``spark.metastore_dir`` and
managed tables under ``spark.warehouse_dir``, so ``db.table`` names are real
metastore tables. For the CLI its driver JVM logs to ``logs/`` beside the metastore
(:func:`lakescore.jobs.platform.spark.console.start_run_log`).
It gets the Hadoop S3A connector only when the job touches ``s3a://`` (or
``spark.s3a`` says so): its ~620 MiB of jars add seconds to every start and, in
local mode, are copied into each session's scratch directory.

On this host's own masters (``local[…]``, ``local-cluster[…]``) the session gets lakescore's local accelerators
on top (:mod:`lakescore.jobs.platform.spark.local.own_host`: class archive, JVM flags, the worker daemon); on any
other master it is built from ``spark:`` config alone.

A session lakescore builds hides the environment variables that hold the run's secrets
(``generate.endpoint.api_key_env``) wherever Spark shows its configuration: their names join ``spark.redaction.regex``,
so ``spark.executorEnv.<NAME>`` is redacted in the UI's Environment tab, its REST API and the event log
(:func:`redaction_regex`). A session it takes as it is gets one warning line when it would show them
(:func:`warn_if_shown`).

Note: embedded Derby admits one process at a time per metastore directory;
concurrent local jobs need separate ``spark.metastore_dir`` values.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from lakescore.jobs.config import SparkConfig
from lakescore.jobs.platform.spark import interrupts
from lakescore.jobs.platform.spark.adapter import session_facts, set_log_level, start_quiet_classic_jvm
from lakescore.jobs.platform.spark.console import is_verbose, quiet_java_options, start_run_log
from lakescore.jobs.platform.spark.jars import cached_jars, delta_coordinate, s3a_coordinate
from lakescore.jobs.platform.spark.local.own_host import own_host_tuning

__all__ = ["get_or_create_session", "session_source", "needs_s3a", "jar_confs", "redaction_regex", "warn_if_shown"]

SPARK_REDACTION_DEFAULT = r"(?i)secret|password|token|access[.]?key"
"""Spark's own default ``spark.redaction.regex``: a conf whose name or value matches it is redacted where shown."""

log = logging.getLogger(__name__)


def needs_s3a(cfg: SparkConfig, refs: Iterable[str | None] = ()) -> bool:
    """Whether a session built from ``cfg`` gets the S3A connector: ``spark.s3a`` if set,
    else whether any of ``refs`` (the job's input and output) is an ``s3a://`` path."""
    if cfg.s3a is not None:
        return cfg.s3a
    return any(ref and ref.lower().startswith("s3a://") for ref in refs)


def session_source(environ: Mapping[str, str], has_active_session: bool, remote: str | None = None) -> str:
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


def redaction_regex(current: str | None, secret_names: Sequence[str]) -> str | None:
    """``current`` (Spark's default when unset) extended to match the names of the environment variables holding
    secrets, so ``spark.executorEnv.<NAME>`` is redacted; ``None`` when there are none (the setting left alone)."""
    if not secret_names:
        return None
    names = "|".join(re.escape(name) for name in secret_names)
    return f"{current or SPARK_REDACTION_DEFAULT}|spark[.]executorEnv[.](?:{names})$"


def warn_if_shown(spark: SparkSession, secret_names: Sequence[str]) -> None:
    """One warning line when a session lakescore did not build would show ``spark.executorEnv.<NAME>`` of a secret's
    variable in its UI and event log (its ``spark.redaction.regex`` does not match the name)."""
    if not secret_names:
        return
    try:
        pattern = spark.conf.get("spark.redaction.regex", SPARK_REDACTION_DEFAULT) or SPARK_REDACTION_DEFAULT
        shown = [n for n in secret_names if not re.search(pattern, f"spark.executorEnv.{n}")]
    except Exception:  # noqa: BLE001 (a conf this client cannot read, or a Java-only pattern: nothing to judge)
        return
    if shown:
        log.warning(
            "this session's spark.redaction.regex does not match %s: a key set as spark.executorEnv.%s would be "
            "shown in the Spark UI and event log; add it to spark.redaction.regex, or use the platform's secrets "
            '(docs/generation.md, "The key")',
            ", ".join(shown),
            shown[0],
        )


def get_or_create_session(
    cfg: SparkConfig,
    refs: Iterable[str | None] = (),
    worker_imports: Sequence[str] = (),
    secret_names: Sequence[str] = (),
    run_defaults: Mapping[str, str] | None = None,
) -> tuple[SparkSession, bool]:
    """Return ``(spark, created)``; ``created`` tells the caller it owns (and may stop) the session.

    ``cfg`` is used only when :func:`session_source` says ``"build"`` (and ``cfg.remote`` for ``"connect"``). ``refs``
    are the tables / paths the job reads and writes; a built session gets the S3A connector jars
    when :func:`needs_s3a` says so. Jars come from ``spark.jars_dir`` when fetched, else
    Spark resolves them from Maven at start-up (with a warning). On this host's own masters a built session's Python
    daemon imports ``worker_imports`` before forking workers
    (:func:`~lakescore.jobs.platform.spark.local.own_host.own_host_tuning`). ``secret_names``: environment variables
    holding secrets, hidden in a built session (:func:`redaction_regex`), warned of in a taken one
    (:func:`warn_if_shown`). ``run_defaults``: settings the run's input needs, in a built session only, below the user's
    ``spark.conf``.
    """
    active = SparkSession.getActiveSession()
    source = session_source(os.environ, active is not None, cfg.remote)
    if source == "active":
        assert active is not None  # session_source says "active" only when there is one
        log.info("using the existing SparkSession (%s)", session_facts(active))
        warn_if_shown(active, secret_names)
        return active, False
    if source in ("databricks", "spark-submit"):
        spark = SparkSession.builder.getOrCreate()
        log.info("using the %s SparkSession (%s)", source, session_facts(spark))
        warn_if_shown(spark, secret_names)
        return spark, False
    if source == "connect":
        builder = SparkSession.builder.remote(cfg.remote) if cfg.remote else SparkSession.builder
        spark = builder.getOrCreate()  # no remote given: pyspark reads SPARK_REMOTE itself
        log.info(
            "using the Spark Connect session of %s (%s)", cfg.remote or os.environ["SPARK_REMOTE"], session_facts(spark)
        )
        warn_if_shown(spark, secret_names)
        return spark, True

    # Python workers must start this interpreter, or pandas UDFs fail with ModuleNotFoundError.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    warehouse = Path(cfg.warehouse_dir).expanduser().resolve()
    metastore = (
        Path(cfg.metastore_dir).expanduser().resolve() if cfg.metastore_dir else warehouse.parent / "metastore_db"
    )
    metastore.parent.mkdir(parents=True, exist_ok=True)

    verbose = is_verbose()
    driver_log, executor_log = quiet_java_options(cfg.master, verbose, start_run_log(metastore.parent / "logs"))
    confs = jar_confs(cfg, refs, cfg.conf)
    hidden = redaction_regex(confs.get("spark.redaction.regex"), secret_names)
    if hidden is not None:
        confs["spark.redaction.regex"] = hidden
    fast = own_host_tuning(cfg, confs, worker_imports)
    confs = {**fast.defaults, **(run_defaults or {}), **confs, **fast.confs}
    user_java_options = confs.get("spark.driver.extraJavaOptions", "")
    java_options = [f"-Dderby.system.home={metastore.parent}", *fast.driver_java_options]
    confs["spark.driver.extraJavaOptions"] = _join(java_options + [driver_log, user_java_options])
    executor_options = [executor_log] + fast.executor_java_options
    if any(executor_options):
        confs["spark.executor.extraJavaOptions"] = _join(
            executor_options + [confs.get("spark.executor.extraJavaOptions", "")]
        )
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
    if fast.quiet_gateway and not verbose:  # the JVM starts here, its stderr passing through the console's filter
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


def jar_confs(cfg: SparkConfig, refs: Iterable[str | None], confs: Mapping[str, str]) -> dict[str, str]:
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


def _join(options: list[str]) -> str:
    return " ".join(o for o in options if o).strip()
