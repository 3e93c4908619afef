"""``lakescore`` command line: ``score``, ``plan``, ``demo``, ``sweep``, ``history``, ``batches`` and
``fetch-jars [--s3a]``.

Exit codes: 0 success; 1 the run failed a check (validation, error rate, drift) and
published nothing; 2 a configuration, input or model problem (found before any
compute, or an input file Spark cannot read); 3 any other failure; 130 interrupted
(SIGINT / SIGTERM: the chunks staged so far are kept, and rerunning the same
command resumes); 75 a provider batch run (``generate.endpoint.batch``, ``embed.endpoint.batch``) with
``wait: false`` whose batches still run at the provider (the same command run later collects them). Failures print
one line, ``lakescore: error: <reason>`` (or ``lakescore: interrupted ...``), on stderr (``--verbose`` adds the
traceback); with ``--report`` a failed run still writes its JSON report (``status: failed``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from lakescore.jobs.commands.demo import DEMO_ROWS
from lakescore.jobs.commands.plan import SAMPLE_ROWS as PLAN_SAMPLE_ROWS
from lakescore.jobs.commands.sweep import SAMPLE_ROWS
from lakescore.jobs.config import ConfigError, JobConfig, Option, config_options, load_config
from lakescore.jobs.platform.spark.console import configure_logging, log_jvm_to_file
from lakescore.jobs.platform.spark.interrupts import EXIT_INTERRUPTED, was_interrupted
from lakescore.jobs.platform.spark.interrupts import install as install_interrupt_handlers
from lakescore.jobs.report.text import before_compute, kept_trace, one_line
from lakescore.jobs.steps.clock import RunStop, StepClock

__all__ = ["main", "run"]

log = logging.getLogger("lakescore")

EXIT_OK, EXIT_VALIDATION_FAILED, EXIT_BAD_INPUT, EXIT_FAILED = 0, 1, 2, 3
"""``EXIT_VALIDATION_FAILED`` covers every "ran, but published nothing" outcome: validation, error rate, drift."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lakescore", description="Batch model scoring of warehouse tables into Delta."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging and full tracebacks")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--conf", metavar="YAML", help="config file (see conf/local.yaml); flags override it")
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. --set scoring.max_batch_tokens=4096 (repeatable); a string key takes the "
        "text after = as it is, any other key's value is read as YAML",
    )

    score = commands.add_parser("score", parents=[common], help="score a table into Delta")
    _add_config_flags(score, [o for o in config_options() if o.flag])

    plan = commands.add_parser(
        "plan",
        parents=[common],
        help="predict a score run from a sample of its input: rows, tokens, seconds, memory, cost",
    )
    _add_config_flags(plan, [o for o in config_options() if o.flag])
    plan.add_argument(
        "--sample-rows",
        type=int,
        default=PLAN_SAMPLE_ROWS,
        help=f"input rows to read and prepare (default: {PLAN_SAMPLE_ROWS})",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")

    demo = commands.add_parser("demo", parents=[common], help="score a generated review table with all-MiniLM-L6-v2")
    demo.add_argument("--rows", type=int, default=DEMO_ROWS, help=f"sample reviews to generate (default: {DEMO_ROWS})")
    demo.add_argument("--report", metavar="JSON", help="run report path (default: .lakescore/demo/report.json)")

    sweep = commands.add_parser(
        "sweep", parents=[common], help="time the real model on a sample of the input over a range of token budgets"
    )
    _add_config_flags(sweep, [o for o in config_options() if o.flag and o.sweep])
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

    batches = commands.add_parser(
        "batches",
        parents=[common],
        help="list the provider batches of an endpoint.batch output (generate or embed), or --cancel them",
    )
    batches.add_argument("--cancel", action="store_true", help="cancel the batches still running (lines done are kept)")

    fetch = commands.add_parser(
        "fetch-jars", parents=[common], help="download the Delta jars once, for offline sessions"
    )
    fetch.add_argument(
        "--s3a",
        action="store_true",
        help="also the Hadoop S3A connector for s3a:// paths (hadoop-aws + AWS SDK bundle, ~620 MiB)",
    )
    return parser


def _add_config_flags(parser: argparse.ArgumentParser, options: list[Option]) -> None:
    """Add each option's flag to ``parser`` as the schema declares it: choices, help, a switch for a boolean.
    The parsed value lands under the option's dotted key (:func:`_config_flags`)."""
    for option in options:
        flag = option.flag
        if flag is None:
            raise ValueError(f"setting {option.key} has no command-line flag")
        kwargs: dict = {"dest": option.key, "help": _help(option)}
        if option.type is bool:
            kwargs.update(action="store_true", default=None)  # None: not given, the config file decides
        elif option.repeat:  # one item per flag: a stop string may hold a comma
            kwargs.update(action="append", metavar=option.metavar)
        elif option.choices:
            kwargs["choices"] = option.choices
        else:
            kwargs["metavar"] = option.metavar or flag.lstrip("-").upper().replace("-", "_")
            if option.type in (int, float):
                kwargs["type"] = option.type
        parser.add_argument(flag, **kwargs)
    parser.set_defaults(config_keys=tuple(option.key for option in options))


def _help(option: Option) -> str:
    """The option's description as argparse shows it, with its default when it has one worth saying."""
    text = option.description.replace("``", "").replace("%", "%%")
    if option.default not in (None, False, (), {}, ""):
        text += f" (default: {option.default})"
    return text


def _config_flags(args: argparse.Namespace) -> dict:
    """The config flags given on the command line: dotted key -> value (``None`` where not given)."""
    return {key: getattr(args, key) for key in getattr(args, "config_keys", ())}


def _config(args: argparse.Namespace, flags: dict | None = None) -> JobConfig:
    """The job config from ``--conf``, ``--set``, the command's config flags and ``flags``; a bare ``input`` /
    ``output`` name that exists locally becomes ``./name`` (:func:`~lakescore.jobs.platform.tables.local_ref`),
    so what is derived from it stays local too."""
    from lakescore.jobs.platform.tables import local_ref

    cfg = load_config(args.conf, args.overrides, {**_config_flags(args), **(flags or {})})
    return cfg.model_copy(update={"input": local_ref(cfg.input), "output": local_ref(cfg.output)})


def _score(args: argparse.Namespace, clock: StepClock) -> int:
    from lakescore.jobs.report.files import report_location
    from lakescore.jobs.score_job import run_and_record

    cfg = _config(args)
    report = run_and_record(cfg, clock=clock)
    print(report.summary())
    if cfg.report:
        print(report_location(report, cfg.report))
    if report.status != "succeeded":
        print(f"lakescore: error: {report.error}", file=sys.stderr)
        return EXIT_VALIDATION_FAILED
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    import json

    from lakescore.jobs.commands.plan import format_plan, run_plan

    plan = run_plan(_config(args), sample_rows=args.sample_rows)
    print(json.dumps(plan, indent=2) if args.json else format_plan(plan))
    return EXIT_OK


def _demo(args: argparse.Namespace, clock: StepClock) -> int:
    from lakescore.jobs.commands.demo import run_demo

    cfg = _config(args)
    report = run_demo(cfg, rows=args.rows, report_path=args.report, clock=clock)
    return EXIT_OK if report.status == "succeeded" else EXIT_VALIDATION_FAILED


def _sweep(args: argparse.Namespace) -> int:
    import json

    from lakescore.jobs.commands.sweep import format_sweep, run_sweep, sweep_report

    cfg = _config(args)
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
    from lakescore.jobs.platform.spark.session import get_or_create_session

    cfg = _config(args, {"output": args.output, "errors": args.errors})
    spark, _ = get_or_create_session(cfg.spark, (cfg.output,))
    records = run_history(
        spark,
        cfg.output_ref(),
        cfg.errors_ref(),
        None if args.run else args.limit,
        cfg.metrics_ref() if cfg.validation.metrics else None,
    )
    print(format_run(find_run(records, args.run)) if args.run else format_history(records))
    return EXIT_OK


def _batches(args: argparse.Namespace) -> int:
    from lakescore.jobs.commands.batches import format_batches, list_batches
    from lakescore.jobs.platform.spark.session import get_or_create_session

    cfg = _config(args)
    spark, _ = get_or_create_session(cfg.spark, (cfg.output,))
    print(format_batches(list_batches(spark, cfg, cancel=args.cancel), cfg.output))
    return EXIT_OK


def _fetch_jars(args: argparse.Namespace) -> int:
    from lakescore.jobs.commands.fetch_jars import build_archive
    from lakescore.jobs.platform.spark.jars import delta_coordinate, fetch_jars, s3a_coordinate
    from lakescore.jobs.platform.spark.session import jar_confs

    cfg = _config(args)
    coordinates = [delta_coordinate()] + ([s3a_coordinate()] if args.s3a else [])
    for coordinate, jars in fetch_jars(cfg.spark.jars_dir, coordinates).items():
        size = sum(j.stat().st_size for j in jars) / 2**20
        print(f"{coordinate}: {len(jars)} jars ({size:.0f} MiB) ready in {jars[0].parent}")
    if cfg.spark.class_archive:  # for the Delta-only classpath of local sessions (an S3A session starts without it)
        archive = build_archive(cfg.spark.jars_dir, jar_confs(cfg.spark, (), cfg.spark.conf))
        print(f"JVM class archive: {archive or 'none applies (no JDK found)'}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit code."""
    args = _parser().parse_args(argv)
    configure_logging(args.verbose)
    if not args.verbose:  # py4j logs a lost JVM connection through the root logger, traceback and all
        for handler in logging.getLogger().handlers:
            handler.addFilter(_not_from_py4j)
        log_jvm_to_file()  # a session built from here on keeps the JVM's stack traces off the console
    clock = StepClock()  # a scoring run's (score, demo): where it stopped, for the failure line
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "score": lambda a: _score(a, clock),
        "plan": _plan,
        "demo": lambda a: _demo(a, clock),
        "sweep": _sweep,
        "history": _history,
        "batches": _batches,
        "fetch-jars": _fetch_jars,
    }
    install_interrupt_handlers()
    try:
        return handlers[args.command](args)
    except BaseException as exc:  # one line for the operator; --verbose keeps the traceback
        if isinstance(exc, SystemExit):
            raise
        if args.verbose:
            log.exception("failed")
        code, line = _failure(exc, clock.stop_of(exc))
        print(line, file=sys.stderr)
        return code


def _not_from_py4j(record: logging.LogRecord) -> bool:
    return "py4j" not in record.pathname.replace("\\", "/").split("/")


def _failure(exc: BaseException, stop: RunStop | None = None) -> tuple[int, str]:
    """The exit code and the one line an operator reads for ``exc``, which stopped a run at ``stop`` (when it did)."""
    from lakescore.jobs.platform.tables import unreadable_input
    from lakescore.jobs.steps.provider_batch import EXIT_PENDING, BatchesPending

    if isinstance(exc, BatchesPending):
        return EXIT_PENDING, f"lakescore: pending: {exc}"
    if was_interrupted(exc):
        staged = stop.chunks_staged if stop is not None else None
        where = (
            f"after {staged[0]} of {staged[1]} chunks were staged"
            if staged
            else f"during {stop.step if stop is not None else 'start-up'}"
        )
        return EXIT_INTERRUPTED, f"lakescore: interrupted {where}; rerun the same command to resume"
    kept = kept_trace(exc)
    details = f" (details: {kept})" if kept else ""
    unreadable = unreadable_input(exc)
    if unreadable is not None:
        return EXIT_BAD_INPUT, f"lakescore: error: {unreadable}{details}"
    line = one_line(exc, stop.step if stop is not None else None)
    return (EXIT_BAD_INPUT if before_compute(exc) else EXIT_FAILED), f"lakescore: error: {line}{details}"


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
    """The process ends next: :func:`lakescore.jobs.platform.spark.local.own_host.spare_the_exit_collection`."""
    from lakescore.jobs.platform.spark.local.own_host import spare_the_exit_collection

    spare_the_exit_collection()


if __name__ == "__main__":
    sys.exit(main())
