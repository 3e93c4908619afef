"""``lakescore`` command line: ``score``, ``demo``, ``sweep``, ``history`` and ``fetch-jars [--s3a]``.

Exit codes: 0 success; 1 the run failed a check (validation, error rate) and
published nothing; 2 a configuration, input or model problem (found before any
compute, or an input file Spark cannot read); 3 any other failure; 130 interrupted
(SIGINT / SIGTERM: the chunks staged so far are kept, and rerunning the same
command resumes). Failures print one line, ``lakescore: error: <reason>`` (or
``lakescore: interrupted ...``), on stderr (``--verbose`` adds the traceback);
with ``--report`` a failed run still writes its JSON report (``status: failed``).
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from lakescore.jobs.commands.demo import DEMO_ROWS
from lakescore.jobs.platform.interrupts import EXIT_INTERRUPTED, was_interrupted
from lakescore.jobs.platform.interrupts import install as install_interrupt_handlers
from lakescore.jobs.report import one_line
from lakescore.jobs.commands.sweep import SAMPLE_ROWS
from lakescore.jobs.config import (
    BACKENDS, DEVICES, DTYPES, INPUT_FORMATS, QUANTIZATIONS, TASKS, WRITE_MODES, ConfigError, JobConfig, ModelConfig,
    load_config,
)
from lakescore.jobs.platform.console import configure_logging, keep_trace, log_jvm_to_file, run_log

__all__ = ["main", "run"]

log = logging.getLogger("lakescore")

EXIT_OK, EXIT_VALIDATION_FAILED, EXIT_BAD_INPUT, EXIT_FAILED = 0, 1, 2, 3
"""``EXIT_VALIDATION_FAILED`` covers every "ran, but published nothing" outcome: validation, error rate."""

# Flag -> dotted config key. Every flag has a config-file twin; flags win.
_SCORE_FLAGS = {
    "input": "input",
    "output": "output",
    "input_format": "input_format",
    "task": "task",
    "model": "model.source",
    "revision": "model.revision",
    "id_col": "id_col",
    "text_col": "text_col",
    "feature_cols": "feature_cols",
    "feature_prefix": "feature_prefix",
    "device": "model.device",
    "dtype": "model.dtype",
    "backend": "model.backend",
    "quantize": "model.quantize",
    "expect_sha256": "model.expect_sha256",
    "allow_pickle": "model.allow_pickle",
    "trust_remote_code": "model.trust_remote_code",
    "errors": "errors",
    "write_mode": "write.mode",
    "delete_missing": "write.delete_missing",
    "report": "report",
    "run_date": "run_date",
    "run_id": "run_id",
    "master": "spark.master",
    "remote": "spark.remote",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakescore", description="Batch model scoring of warehouse tables into Delta.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging and full tracebacks")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--conf", metavar="YAML", help="config file (see conf/local.yaml); flags override it")
    common.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config key, e.g. --set scoring.max_batch_tokens=4096 (repeatable)",
    )

    score = commands.add_parser("score", parents=[common], help="score a table into Delta")
    score.add_argument("--input", help="metastore table (db.table) or Parquet/Delta path")
    score.add_argument("--output", help="Delta path or metastore table (db.table); overwritten")
    score.add_argument("--input-format", choices=INPUT_FORMATS, help="how to read a path input")
    score.add_argument("--task", choices=TASKS, help=f"what the model computes (default: {JobConfig.task})")
    score.add_argument(
        "--model", help="model directory, Hadoop URI, MLflow URI (models:/name/version, models:/name@alias, runs:/id/path) "
        "or Hugging Face hub id",
    )
    score.add_argument("--revision", help="hub revision (branch, tag or commit)")
    score.add_argument("--id-col", help="input column copied to the output to identify each row")
    score.add_argument("--text-col", help="input column with the text to score (classify, embed, ner)")
    score.add_argument("--feature-cols", help="tabular: comma-separated numeric feature columns, in model order")
    score.add_argument("--feature-prefix", help="tabular: use every column starting with this prefix")
    score.add_argument("--device", choices=DEVICES, help=f"where workers run the model (default: {ModelConfig.device})")
    score.add_argument("--dtype", choices=DTYPES, help=f"model precision (default: {ModelConfig.dtype})")
    score.add_argument("--backend", choices=BACKENDS, help=f"what runs the forward (default: {ModelConfig.backend})")
    score.add_argument(
        "--quantize", choices=QUANTIZATIONS, help=f"int8 on the onnx backend, within a checked tolerance (default: {ModelConfig.quantize})"
    )
    score.add_argument("--expect-sha256", metavar="HEX", help="refuse to score unless the weights digest equals this")
    score.add_argument(
        "--allow-pickle", action="store_true", default=None, help="allow pickle-based weights (can run arbitrary code)"
    )
    score.add_argument(
        "--trust-remote-code", action="store_true", default=None, help="run model code shipped with the model"
    )
    score.add_argument("--errors", help="dead-letter table or path (default: <output>_errors)")
    score.add_argument(
        "--write-mode", choices=WRITE_MODES,
        help="overwrite the table, replace only this run's rows, or incremental: score only new and changed rows, MERGE them",
    )
    score.add_argument(
        "--delete-missing", action="store_true", default=None,
        help="incremental: delete output rows whose id is no longer in the input",
    )
    score.add_argument("--report", metavar="JSON", help="write the run report here")
    score.add_argument("--run-date", metavar="YYYY-MM-DD", help="the date the run is for; default run id")
    score.add_argument("--run-id", help="id written into every row (default: --run-date, else timestamp + random)")
    score.add_argument("--master", help="Spark master when lakescore builds the session (default: local[*])")
    score.add_argument("--remote", metavar="sc://HOST:PORT", help="run over Spark Connect on this server (or set SPARK_REMOTE)")

    demo = commands.add_parser("demo", parents=[common], help="score a generated review table with all-MiniLM-L6-v2")
    demo.add_argument("--rows", type=int, default=DEMO_ROWS, help=f"sample reviews to generate (default: {DEMO_ROWS})")
    demo.add_argument("--report", metavar="JSON", help="run report path (default: .lakescore/demo/report.json)")

    sweep = commands.add_parser(
        "sweep", parents=[common], help="time the real model on a sample of the input over a range of token budgets"
    )
    sweep.add_argument("--input", help="metastore table or Parquet/Delta path to sample")
    sweep.add_argument("--input-format", choices=INPUT_FORMATS)
    sweep.add_argument("--task", choices=TASKS)
    sweep.add_argument("--model", help="model directory or Hugging Face hub id")
    sweep.add_argument("--revision", help="hub revision")
    sweep.add_argument("--text-col", help="input column with the text to score")
    sweep.add_argument("--master", help="Spark master when lakescore builds the session")
    sweep.add_argument("--remote", metavar="sc://HOST:PORT", help="run over Spark Connect on this server")
    sweep.add_argument("--sample-rows", type=int, default=SAMPLE_ROWS, help=f"rows to sample (default: {SAMPLE_ROWS})")
    sweep.add_argument("--budgets", help="comma-separated token budgets (default: a per-device range)")
    sweep.add_argument("--report", metavar="JSON", help="write the sweep as JSON here")

    history = commands.add_parser(
        "history", parents=[common], help="list an output's past runs, or show one run's report (--run)"
    )
    history.add_argument("output", help="the output: Delta path or metastore table")
    history.add_argument("--run", metavar="RUN_ID", help="show this run's report and where its HTML is")
    history.add_argument("--errors", help="its dead-letter table (default: <output>_errors)")
    history.add_argument("--limit", type=int, default=20, help="newest runs to list (default: 20)")

    fetch = commands.add_parser("fetch-jars", parents=[common], help="download the Delta jars once, for offline sessions")
    fetch.add_argument(
        "--s3a", action="store_true",
        help="also the Hadoop S3A connector for s3a:// paths (hadoop-aws + AWS SDK bundle, ~620 MiB)",
    )
    return parser


def _config(args: argparse.Namespace, flags: Optional[dict] = None) -> JobConfig:
    """The job config; a bare ``input`` / ``output`` name that exists locally becomes ``./name``
    (:func:`~lakescore.jobs.platform.tables.local_ref`), so what is derived from it stays local too."""
    from dataclasses import replace

    from lakescore.jobs.platform.tables import local_ref

    cfg = load_config(args.conf, args.overrides, flags)
    return replace(cfg, input=local_ref(cfg.input), output=local_ref(cfg.output))


def _score(args: argparse.Namespace) -> int:
    from lakescore.jobs.report import report_location, write_report
    from lakescore.jobs.score_job import run_scoring
    from lakescore.jobs.steps.report import failure_report

    cfg = _config(args, {key: getattr(args, name) for name, key in _SCORE_FLAGS.items()})
    try:
        report = run_scoring(cfg)
    except BaseException as exc:  # a scheduler still finds a report saying where and why
        if cfg.report:
            failed = failure_report(cfg, exc, "interrupted" if was_interrupted(exc) else "failed")
            failed.log_file = _kept_trace(exc) or _path_or_none(run_log())
            write_report(failed, cfg.report)
        raise
    report.log_file = _path_or_none(run_log())
    if cfg.report:
        write_report(report, cfg.report)
    print(report.summary())
    if cfg.report:
        print(report_location(report, cfg.report))
    if report.status != "succeeded":
        print(f"lakescore: error: {report.error}", file=sys.stderr)
        return EXIT_VALIDATION_FAILED
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from lakescore.jobs.commands.demo import run_demo

    cfg = _config(args)
    report = run_demo(cfg, rows=args.rows, report_path=args.report)
    return EXIT_OK if report.status == "succeeded" else EXIT_VALIDATION_FAILED


def _sweep(args: argparse.Namespace) -> int:
    import json

    from lakescore.jobs.commands.sweep import format_sweep, run_sweep, sweep_report

    flags = {key: getattr(args, name, None) for name, key in _SCORE_FLAGS.items() if hasattr(args, name)}
    cfg = _config(args, flags)
    try:
        budgets = [int(b) for b in args.budgets.split(",")] if args.budgets else None
    except ValueError as exc:
        raise ConfigError(f"--budgets must be comma-separated integers, got {args.budgets!r}") from exc
    points = run_sweep(cfg, sample_rows=args.sample_rows, budgets=budgets)
    print(format_sweep(points))
    if args.report:
        Path(args.report).write_text(json.dumps(sweep_report(points), indent=2) + "\n", encoding="utf-8")
    return EXIT_OK


def _history(args: argparse.Namespace) -> int:
    from lakescore.jobs.commands.history import find_run, format_history, format_run, run_history
    from lakescore.jobs.platform.session import get_or_create_session

    cfg = _config(args, {"output": args.output, "errors": args.errors})
    spark, _ = get_or_create_session(cfg.spark, (cfg.output,))
    records = run_history(spark, cfg.output, cfg.errors_ref(), None if args.run else args.limit)
    print(format_run(find_run(records, args.run)) if args.run else format_history(records))
    return EXIT_OK


def _fetch_jars(args: argparse.Namespace) -> int:
    from lakescore.jobs.platform.class_archive import build_archive
    from lakescore.jobs.platform.jars import delta_coordinate, fetch_jars, s3a_coordinate
    from lakescore.jobs.platform.session import jar_confs

    cfg = _config(args)
    coordinates = [delta_coordinate()] + ([s3a_coordinate()] if args.s3a else [])
    for coordinate, jars in fetch_jars(cfg.spark.jars_dir, coordinates).items():
        size = sum(j.stat().st_size for j in jars) / 2**20
        print(f"{coordinate}: {len(jars)} jars ({size:.0f} MiB) ready in {jars[0].parent}")
    if cfg.spark.class_archive:  # for the Delta-only classpath of local sessions (an S3A session starts without it)
        archive = build_archive(cfg.spark.jars_dir, jar_confs(cfg.spark, (), cfg.spark.conf))
        print(f"JVM class archive: {archive or 'none applies (no JDK found)'}")
    return EXIT_OK


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit code."""
    args = _parser().parse_args(argv)
    configure_logging(args.verbose)
    if not args.verbose:  # py4j logs a lost JVM connection through the root logger, traceback and all
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_from_py4j)
        log_jvm_to_file()  # a session built from here on keeps the JVM's stack traces off the console
    handlers = {"score": _score, "demo": _demo, "sweep": _sweep, "history": _history, "fetch-jars": _fetch_jars}
    install_interrupt_handlers()
    try:
        return handlers[args.command](args)
    except BaseException as exc:  # one line for the operator; --verbose keeps the traceback
        if isinstance(exc, SystemExit):
            raise
        if args.verbose:
            log.exception("failed")
        code, line = _failure(exc)
        print(line, file=sys.stderr)
        return code


def _not_from_py4j(record: logging.LogRecord) -> bool:
    return "py4j" not in record.pathname.replace("\\", "/").split("/")


def _failure(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one line an operator reads for ``exc``."""
    from lakescore.jobs.platform.tables import unreadable_input

    if was_interrupted(exc):
        staged = getattr(exc, "lakescore_chunks", None)
        where = f"after {staged[0]} of {staged[1]} chunks were staged" if staged else f"during {getattr(exc, 'lakescore_step', 'start-up')}"
        return EXIT_INTERRUPTED, f"lakescore: interrupted {where}; rerun the same command to resume"
    kept = _kept_trace(exc)
    details = f" (details: {kept})" if kept else ""
    unreadable = unreadable_input(exc)
    if unreadable is not None:
        return EXIT_BAD_INPUT, f"lakescore: error: {unreadable}{details}"
    return (EXIT_BAD_INPUT if _is_before_compute(exc) else EXIT_FAILED), f"lakescore: error: {one_line(exc)}{details}"


def _kept_trace(exc: BaseException) -> Optional[str]:
    """The log file that now holds ``exc``'s full traceback (written there once), or ``None``: an interruption or a
    refusal before compute says everything in its one line, and a session lakescore did not build (or ``-v``) has no
    such file."""
    if was_interrupted(exc) or _is_before_compute(exc):
        return None
    return _path_or_none(keep_trace(exc))


def _path_or_none(path: Optional[Path]) -> Optional[str]:
    return str(path) if path is not None else None


def run() -> None:
    """Entry point of the ``lakescore`` console script and of Databricks ``python_wheel_task``.

    Returns normally on success and raises ``SystemExit`` with :func:`main`'s code otherwise,
    so a failed run fails whoever called it: a shell sees the exit code, and a Databricks
    wheel task, which calls the entry point function in its own Python process rather than
    running the console script, gets an exception instead of a return value it may ignore.
    """
    code = main()
    _spare_the_exit_collection()
    if code != EXIT_OK:
        raise SystemExit(code)


def _spare_the_exit_collection() -> None:
    """The process ends next: keep the interpreter's last cyclic garbage collection off everything still loaded.

    By now the driver holds GX's, pandas' and matplotlib's modules, and Python's teardown collected them
    for ~0.9 s after the run had finished (a 200-row run on a 2-core AMD EPYC: 0.95 s from the last atexit
    handler to the process's end, 0.07 s with this). ``gc.freeze`` moves the objects alive now out of the
    collector's reach; atexit handlers, stream flushes and reference-counted finalizers still run, and the
    operating system takes the memory back as the process ends.
    """
    gc.freeze()


def _is_before_compute(exc: BaseException) -> bool:
    from lakescore.jobs.platform.tables import TableError
    from lakescore.schemas.contracts import InputContractError
    from lakescore.udfs.model_source import ModelSourceError

    return isinstance(exc, (ConfigError, InputContractError, TableError, ModelSourceError))


if __name__ == "__main__":
    sys.exit(main())
