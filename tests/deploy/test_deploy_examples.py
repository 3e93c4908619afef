"""The Databricks and EMR examples under deploy/, checked against lakescore's real CLI and config.

Fast and offline: no Spark, no cloud. Every argument list the examples hand to lakescore goes
through ``lakescore.jobs.cli._parser()``, and the config it names is loaded with ``load_config`` plus the
flags, as ``lakescore score`` does, down to ``require_for_scoring()``. What cannot be shown here
(that Databricks or EMR accept and run these files) is said in README.md and deploy/emr/README.md.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

from lakescore.jobs.cli import EXIT_BAD_INPUT, _config_flags, _parser
from lakescore.jobs.config import JobConfig, load_config
from lakescore.jobs.references import parse_table_name
from lakescore.udfs.models.mlflow_source import check_uri
from lakescore.udfs.models.model_source import is_mlflow_uri

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "deploy" / "databricks"
JOB_FILES = {
    "cluster": BUNDLE / "resources" / "score_reviews.job.yml",
    "serverless": BUNDLE / "resources" / "score_reviews_serverless.job.yml",
}
EMR = REPO / "deploy" / "emr"

# Values Databricks fills in at deploy or run time, for the substitution below.
WORKSPACE_FILE_PATH = "/Workspace/Users/someone@example.com/.bundle/lakescore/dev/files"
RUN_DATE = "2026-11-20"


def _project(name: str):
    """A field of pyproject.toml's ``[project]`` table (the package's metadata)."""
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][name]


def _console_scripts() -> dict[str, str]:
    return dict(_project("scripts"))


def _score_config(argv: list[str], conf_file: Path) -> JobConfig:
    """Parse ``argv`` with lakescore's parser and resolve it as ``lakescore score`` would."""
    args = _parser().parse_args(argv)
    assert args.command == "score"
    cfg = load_config(conf_file, args.overrides, _config_flags(args))
    cfg.require_for_scoring()
    return cfg


def _split_spark_submit(argv: list[str]) -> tuple[dict[str, list[str]], str, list[str]]:
    """``spark-submit`` options (each with its values), the primary resource, the application's args."""
    switches = {"--verbose", "-v", "--supervise"}
    options: dict[str, list[str]] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in switches:
            options.setdefault(argv[i], []).append("")
            i += 1
        else:
            options.setdefault(argv[i], []).append(argv[i + 1])
            i += 2
    return options, argv[i], argv[i + 1 :]


def _confs(options: dict[str, list[str]]) -> dict[str, str]:
    return dict(c.split("=", 1) for c in options.get("--conf", []))


# --- conf/ ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["local.yaml", "databricks.yaml", "emr.yaml"])
def test_every_config_file_loads(name):
    load_config(REPO / "conf" / name)  # unknown keys or ill-typed values raise ConfigError


@pytest.mark.parametrize("name", ["databricks.yaml", "emr.yaml"])
def test_cluster_configs_leave_the_session_to_the_platform(name):
    """No spark: section: on Databricks and under spark-submit lakescore never builds the session."""
    assert "spark" not in yaml.safe_load((REPO / "conf" / name).read_text(encoding="utf-8"))


# --- Databricks -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle():
    return yaml.safe_load((BUNDLE / "databricks.yml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module", params=sorted(JOB_FILES))
def job_path(request) -> Path:
    return JOB_FILES[request.param]


@pytest.fixture(scope="module")
def job(job_path):
    (job,) = yaml.safe_load(job_path.read_text(encoding="utf-8"))["resources"]["jobs"].values()
    return job


@pytest.fixture(scope="module")
def task(job):
    (task,) = job["tasks"]
    return task


def test_bundle_includes_the_job_and_declares_every_variable_it_uses(bundle, job_path):
    assert bundle["bundle"]["name"]
    included = [p for pattern in bundle["include"] for p in BUNDLE.glob(pattern)]
    assert job_path in included
    used = set(re.findall(r"\$\{var\.([A-Za-z0-9_]+)\}", job_path.read_text(encoding="utf-8")))
    assert used and used <= set(bundle["variables"]), used - set(bundle["variables"])
    assert [name for name, target in bundle["targets"].items() if target.get("default")] == ["dev"]


def test_wheel_task_entry_point_is_the_wheels_console_script(task):
    wheel_task = task["python_wheel_task"]
    assert wheel_task["package_name"] == _project("name")
    target = _console_scripts()[wheel_task["entry_point"]]
    module, _, func = target.partition(":")
    assert callable(getattr(importlib.import_module(module), func))


def _task_dependencies(job: dict, task: dict) -> list[str]:
    """What the task installs: its ``libraries`` on a cluster, its environment's dependencies on serverless."""
    if "environment_key" not in task:
        return [next(iter(library.values())) for library in task["libraries"]]
    (environment,) = [e for e in job["environments"] if e["environment_key"] == task["environment_key"]]
    return environment["spec"]["dependencies"]


def test_wheel_library_is_what_make_wheel_builds_and_lies_in_the_sync_root(bundle, job_path, job, task):
    (library,) = [d for d in _task_dependencies(job, task) if d.endswith(".whl")]
    pattern = os.path.normpath(job_path.parent / library)
    assert Path(pattern).parent == REPO / "dist"
    wheel = f"lakescore-{_project('version')}-py3-none-any.whl"  # the Makefile's $(WHEEL)
    assert fnmatch.fnmatch(wheel, Path(pattern).name)
    # Local libraries must lie inside the sync root: the common parent of the bundle and sync paths.
    sync_root = os.path.commonpath([str(BUNDLE)] + [os.path.normpath(BUNDLE / p) for p in bundle["sync"]["paths"]])
    assert Path(pattern).is_relative_to(sync_root)


def test_serverless_job_has_no_cluster_and_installs_the_extras_its_model_needs(bundle):
    (job,) = yaml.safe_load(JOB_FILES["serverless"].read_text(encoding="utf-8"))["resources"]["jobs"].values()
    for task in job["tasks"]:
        assert not {"job_cluster_key", "new_cluster", "existing_cluster_id", "libraries"} & set(task), task
        assert task["environment_key"] in {e["environment_key"] for e in job["environments"]}
    assert "job_clusters" not in job
    (environment,) = job["environments"]
    assert int(environment["spec"]["environment_version"]) >= 4  # Spark 4: PySpark >= 4.0.1, as the wheel needs
    extras = dict(_project("optional-dependencies"))
    others = [d for d in environment["spec"]["dependencies"] if not d.endswith(".whl")]
    assert others == extras["mlflow"]  # the model is an MLflow URI: the `mlflow` extra, pinned alike
    assert not [d for d in _project("dependencies") if d.startswith(("pyspark", "delta-spark"))]  # the platform's own


def test_nightly_schedule_and_run_date_parameter(job):
    fields = job["schedule"]["quartz_cron_expression"].split()
    assert len(fields) in (6, 7) and job["schedule"]["timezone_id"]
    assert {p["name"] for p in job["parameters"]} == {"run_date"}
    assert job["max_concurrent_runs"] == 1


def test_wheel_task_parameters_are_a_valid_lakescore_command(bundle, job, task):
    defaults = {name: v["default"] for name, v in bundle["variables"].items()}
    argv = []
    for raw in task["python_wheel_task"]["parameters"]:
        arg = re.sub(r"\$\{var\.(\w+)\}", lambda m: str(defaults[m.group(1)]), raw)
        arg = arg.replace("${workspace.file_path}", WORKSPACE_FILE_PATH)
        arg = arg.replace("{{job.parameters.run_date}}", RUN_DATE).replace("{{job.run_id}}", "1234")
        assert "${" not in arg and "{{" not in arg, f"unresolved reference in {raw!r}"
        argv.append(arg)

    args = _parser().parse_args(argv)
    # The synced conf/ lands under workspace.file_path as it lies under the sync root (the repo root).
    assert args.conf.startswith(WORKSPACE_FILE_PATH + "/")
    conf_file = REPO / args.conf[len(WORKSPACE_FILE_PATH) + 1 :]
    assert conf_file == REPO / "conf" / "databricks.yaml"

    cfg = _score_config(argv, conf_file)
    assert (cfg.input, cfg.output) == (defaults["input_table"], defaults["output_table"])
    assert cfg.model.source in (defaults["model_path"], defaults["model_uri"])
    assert cfg.resolved_run_id() == RUN_DATE and cfg.report == f"{defaults['report_dir']}/{RUN_DATE}.json"
    for ref in (cfg.input, cfg.output, cfg.errors_ref()):
        assert len(parse_table_name(ref).parts) == 3  # Unity Catalog names: catalog.schema.table
    if is_mlflow_uri(cfg.model.source):
        check_uri(cfg.model.source)  # a URI lakescore can pin to a registry version


# --- EMR --------------------------------------------------------------------------------------


def test_emr_step_is_a_spark_submit_of_the_launcher_with_valid_lakescore_args():
    steps = json.loads((EMR / "score-reviews.step.json").read_text(encoding="utf-8"))
    assert steps
    for step in steps:
        assert step["Type"] == "CUSTOM_JAR" and step["Jar"] == "command-runner.jar"
        assert step["ActionOnFailure"] in ("CONTINUE", "CANCEL_AND_WAIT", "TERMINATE_CLUSTER")
        assert step["Args"][0] == "spark-submit"
        options, primary, app_args = _split_spark_submit(step["Args"][1:])

        assert Path(primary).name == "launcher.py" and (REPO / "jobs" / "launcher.py").is_file()
        # The env archive is unpacked as ./environment, and that is the Python Spark runs.
        assert any(a.endswith(".tar.gz#environment") for a in ",".join(options["--archives"]).split(","))
        assert _confs(options)["spark.pyspark.python"] == "./environment/bin/python"
        # The config file ships next to the driver under the name lakescore is told to read.
        conf_name = _parser().parse_args(app_args).conf
        assert conf_name in {Path(f).name for f in ",".join(options["--files"]).split(",")}
        cfg = _score_config(app_args, REPO / "conf" / conf_name)
        assert cfg.resolved_run_id() and cfg.model.source.startswith("/")


def test_emr_serverless_job_run_is_a_valid_lakescore_submission():
    run = json.loads((EMR / "serverless-job-run.json").read_text(encoding="utf-8"))
    submit = run["jobDriver"]["sparkSubmit"]
    assert Path(submit["entryPoint"]).name == "launcher.py"
    options, primary, rest = _split_spark_submit(shlex.split(submit["sparkSubmitParameters"]) + ["launcher.py"])
    assert primary == "launcher.py" and rest == []

    archives = {a.rsplit("#", 1)[1]: a for a in ",".join(options["--archives"]).split(",")}
    confs = _confs(options)
    for key in (
        "spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON",
        "spark.emr-serverless.driverEnv.PYSPARK_PYTHON",
        "spark.executorEnv.PYSPARK_PYTHON",
    ):
        assert confs[key] == "./environment/bin/python"
    assert "environment" in archives

    app_args = submit["entryPointArguments"]
    conf_name = _parser().parse_args(app_args).conf
    assert conf_name in {Path(f).name for f in ",".join(options["--files"]).split(",")}
    cfg = _score_config(app_args, REPO / "conf" / conf_name)
    if cfg.model.source.startswith("./"):  # a relative model is an archive unpacked beside each process
        assert cfg.model.source[2:].split("/")[0] in archives


# --- the launcher -----------------------------------------------------------------------------


def test_launcher_runs_the_cli_and_exits_with_its_code(tmp_path):
    """spark-submit's primary resource, run as a script: a config error exits 2 before any Spark."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "jobs" / "launcher.py"), "score", "--set", "task=summarize"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr
    assert (
        "lakescore: error: task must be one of classify, embed, ner, image_classify, image_embed, tabular"
        in proc.stderr
    )
