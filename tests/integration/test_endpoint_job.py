"""``--task generate`` over a real OpenAI-compatible server on real Spark + Delta: ``transformers serve`` running the
tiny seeded Llama-shaped model on CPU, offline, started once for the module.

* an endpoint behind a proxy that answers every third request 429 with ``Retry-After``: greedy text equal to
  transformers' own ``generate`` on each row, the 429s retried and counted, tokens and cost from ``usage``, the key in
  no log, report or Delta log, an incremental rerun that sends nothing, and one that scores every row again once the
  proxy's ``/v1/models`` says something else of the model;
* a setting the server cannot honour (``json_schema``: ``transformers serve`` has no ``response_format``;
  ``logprobs``: it returns none) refused before any row is sent, in one line;
* the endpoint killed mid-run: the run stops in one line naming it, nothing published, and the rerun resumes the
  staged chunks;
* a served engine (``generate.server.engine: transformers``) started by the job, killed mid-run and restarted once,
  with no engine process left when the run ends;
* two ``lakescore score`` processes with ``generate.server`` on this host at once: the one that ends first leaves the
  other's engine serving, and both publish every row;
* an input in one partition, each document's questions scattered through it: the rows reach the scoring function by
  range of their rendered prompt, sorted within each task (``scoring.group_prefixes``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from lakescore.jobs.config import load_config
from lakescore.jobs.platform.tables import delta_history
from lakescore.jobs.report.text import one_line
from lakescore.jobs.score_job import run_scoring
from lakescore.jobs.steps.metrics import record_run
from lakescore.jobs.testing_hooks import BARRIER_ENV
from lakescore.udfs.remote.answers import EndpointRefused
from lakescore.udfs.remote.engine import EngineServer, healthy
from tests.integration.test_generate_job import _reference_texts
from tests.integration.test_score_job import read_output
from tests.served_models import RateLimitingProxy, TransformersServe, python_processes_named

TEMPLATE = "Review: {body}\nSummary:"
KEY_ENV = "LAKESCORE_TEST_ENDPOINT_KEY"
KEY = "sk-lakescore-test-5f0e1d2c3b4a"


@pytest.fixture(scope="module")
def served(tiny_causal_lm_dir, module_tmp_path):
    server = TransformersServe(tiny_causal_lm_dir, module_tmp_path / "serve.log").start()
    yield server
    server.kill()


def _reviews(n: int = 7) -> pd.DataFrame:
    rows = [(i, f"the food was good and room {i} was quiet") for i in range(1, n + 1)]
    rows[2] = (3, None)  # null_input, never sent
    return pd.DataFrame(rows, columns=["review_id", "body"])


def _write(spark, frame: pd.DataFrame, path: Path) -> None:
    spark.createDataFrame(frame, "review_id long, body string").write.format("delta").mode("overwrite").save(str(path))


def _config(source: Path, output: Path, **flags):
    return load_config(
        flags={
            "input": str(source),
            "output": str(output),
            "task": "generate",
            "id_col": "review_id",
            "generate.prompt_template": TEMPLATE,
            "generate.max_new_tokens": 6,
            "max_error_rate": 0.5,
            "spark.master": "local[2]",
            **flags,
        }
    )


def _expected(model_dir: Path, frame: pd.DataFrame) -> tuple[list[str], list[int]]:
    present = frame[frame["body"].notna()]
    return _reference_texts(model_dir, [TEMPLATE.format(**row) for row in present.to_dict("records")], 6)


def _files_text(*folders: Path) -> str:
    return "\n".join(
        p.read_text(errors="replace")
        for folder in folders
        if folder.exists()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.suffix in (".json", ".html", ".crc", ".log", "")
    )


@pytest.fixture
def executor_key(spark):
    """The key in the executors' environment, as ``spark.executorEnv.<NAME>`` puts it there (the session's Python
    workers started before this test: what ``spark.executorEnv`` gave them at start is the SparkContext's
    ``environment``, which each new scoring function carries to a worker started with it)."""
    environment = spark.sparkContext.environment
    environment[KEY_ENV] = KEY
    yield
    environment.pop(KEY_ENV, None)


def test_an_endpoint_behind_a_rate_limit_matches_in_process_greedy_text_and_never_shows_its_key(
    spark,
    tmp_path,
    served,
    tiny_causal_lm_dir,
    capfd,
    executor_key,
):
    source, output, report_path = tmp_path / "reviews", tmp_path / "summaries", tmp_path / "run.json"
    frame = _reviews()
    _write(spark, frame, source)
    endpoint = {
        "generate.endpoint.model": str(tiny_causal_lm_dir),
        "generate.endpoint.api_key_env": KEY_ENV,
        "generate.endpoint.price": {"input": 2.0, "output": 10.0},
        "write.mode": "incremental",
        "report": str(report_path),
    }
    entry = {"id": str(tiny_causal_lm_dir), "object": "model", "created": 1_700_000_000, "owned_by": "lakescore-tests"}

    def listed(permission: str) -> dict:  # vLLM's shape: a permission entry with an id and a time drawn per answer
        drawn = {**entry, "permission": [{"id": permission, "created": int(time.time()), "allow_logprobs": True}]}
        return {"object": "list", "data": [{"id": "another-model", "object": "model"}, drawn]}

    with RateLimitingProxy(served.port, every=3, retry_after=1) as proxy:
        proxy.models = listed("modelperm-1")
        cfg = _config(source, output, **{"generate.endpoint.url": proxy.url, **endpoint})
        report = run_scoring(cfg, spark)
        record_run(spark, cfg, report)  # the JSON and HTML report, and the metrics table's row
        assert report.status == "succeeded", report.error
        assert report.workers["requests"] == proxy.posts  # the report counts what the server saw, no more
        # what /v1/models says is the model's identity, less what the server draws for each answer
        assert report.model_listing == {"answered": True, "entry": {**entry, "permission": [{"allow_logprobs": True}]}}
        out = read_output(spark, str(output))
        expected, prompt_tokens = _expected(tiny_causal_lm_dir, frame)
        assert out["generated_text"].tolist() == expected
        assert out["prompt_tokens"].tolist() == prompt_tokens  # the server's usage
        assert report.error_reasons == {"null_input": 1}
        workers = report.workers
        # (the preflight's request may be the one a 429 met: the executors' preflight counts in no row)
        assert 1 <= workers["rate_limited"] <= proxy.refused and workers["retries"] >= workers["rate_limited"]
        preflight = workers["preflight"]  # the executors' preflight requests: counted and billed as the rows' are
        assert preflight["requests"] >= 1 and workers["requests"] >= preflight["requests"] + 6
        assert workers["tokens_out"] == out["completion_tokens"].sum() + preflight["tokens_out"]
        assert workers["tokens_in"] == out["prompt_tokens"].sum() + preflight["tokens_in"]
        token_cost = (workers["tokens_in"] * 2.0 + workers["tokens_out"] * 10.0) / 1e6
        assert (
            report.cost["token_cost"] == pytest.approx(token_cost, abs=1e-6)
            and report.cost["cost"] >= report.cost["token_cost"]
        )
        assert "the endpoint's tokens" in report.summary()
        assert f"({workers['rate_limited']} answered 429)" in report.summary()
        metrics = spark.read.format("delta").load(f"{output}_metrics").toPandas().iloc[-1]
        assert (metrics["tokens_in"], metrics["tokens_out"]) == (workers["tokens_in"], workers["tokens_out"])
        assert metrics["cost"] == pytest.approx(report.cost["cost"]) and metrics["model_id"] == str(tiny_causal_lm_dir)
        assert f"Bearer {KEY}" in proxy.authorizations  # the key was sent, in its header

        # Incremental: nothing changed (the listing's drawn permission aside), so nothing is sent (the null row is tried
        # again, as every row without an output is, and dead-lettered again without a request).
        proxy.models = listed("modelperm-2")
        posts = proxy.posts
        again = run_scoring(
            _config(source, output, **{"generate.endpoint.url": proxy.url, **endpoint, "max_error_rate": 1.0}), spark
        )
        assert again.status == "succeeded", again.error
        assert again.rows_kept == 6 and again.error_reasons == {"null_input": 1}
        # nothing to score: the preflight read /v1/models and sent no paid request (issue 57: it sent its probe anyway)
        assert proxy.posts == posts and "requests" not in again.workers and "preflight" not in again.workers

        # /v1/models failing (503) on a rerun is no news: nothing is scored or billed again (issue 57: "scoring spec
        # changed, every row scored again", and once more when the listing came back)
        proxy.models_status = 503
        outage = run_scoring(
            _config(source, output, **{"generate.endpoint.url": proxy.url, **endpoint, "max_error_rate": 1.0}), spark
        )
        proxy.models_status = None
        assert outage.status == "succeeded", outage.error
        assert outage.rows_kept == 6 and not outage.spec_changes and outage.model_sha256 == report.model_sha256
        assert proxy.posts == posts and "requests" not in outage.workers

        # The server now says something else of the model behind the same name: every row is scored again, and the
        # output's commit records the new entry.
        proxy.models = {"object": "list", "data": [{**entry, "created": 1_700_086_400, "root": "tiny-v2"}]}
        proxy.every = 10_000  # (429s are the first run's to prove; the suite too: this run is about what it rescores)
        posts = proxy.posts
        changed = run_scoring(
            _config(
                source,
                output,
                **{"generate.endpoint.url": proxy.url, **endpoint, "max_error_rate": 1.0, "validation.enabled": False},
            ),
            spark,
        )
        assert changed.status == "succeeded", changed.error
        assert (changed.rows_kept, changed.output_rows) == (0, 6) and changed.model_sha256 != report.model_sha256
        assert changed.spec_changes == ["the endpoint /v1/models changed"]
        # rows to score: the preflight's probe went out after the plan, and is counted as the server counted it
        assert changed.workers["preflight"]["requests"] >= 1 and changed.workers["requests"] == proxy.posts - posts
        (commit,) = delta_history(spark, str(output), 1)
        assert json.loads(commit.spec["files"]["/v1/models"])["entry"]["root"] == "tiny-v2"
        assert read_output(spark, str(output))["generated_text"].tolist() == expected

    captured = capfd.readouterr()
    shown = "\n".join(
        [
            captured.out,
            captured.err,
            _files_text(report_path.parent, output, Path(f"{output}_errors"), Path(f"{output}_metrics")),
        ]
    )
    assert report_path.is_file() and Path(f"{output}_metrics", "_delta_log").is_dir()  # what was searched is there
    assert KEY not in shown


def test_a_setting_the_server_cannot_honour_is_refused_before_any_row_is_sent(
    spark, tmp_path, served, tiny_causal_lm_dir
):
    source = tmp_path / "reviews"
    _write(spark, _reviews(), source)
    with pytest.raises(EndpointRefused) as refused:
        run_scoring(
            _config(
                source,
                tmp_path / "json",
                **{
                    "generate.endpoint.url": served.url,
                    "generate.endpoint.model": str(tiny_causal_lm_dir),
                    "generate.json_schema": {
                        "type": "object",
                        "properties": {"stars": {"type": "integer"}},
                        "required": ["stars"],
                    },
                },
            ),
            spark,
        )
    line = one_line(
        refused.value
    )  # transformers serve refuses response_format on /v1/completions (and drops it on chat)
    assert line == (
        f"endpoint {served.url} (model {tiny_causal_lm_dir}) refused the run's settings: HTTP 422: Unexpected "
        "fields in the request: {'response_format'}"
    ), line
    assert not (tmp_path / "json").exists()

    # transformers serve takes the request's logprobs and returns none: the column cannot be filled, so no row is sent
    with pytest.raises(EndpointRefused) as refused:
        run_scoring(
            _config(
                source,
                tmp_path / "logprobs",
                **{
                    "generate.endpoint.url": served.url,
                    "generate.endpoint.model": str(tiny_causal_lm_dir),
                    "generate.logprobs": True,
                },
            ),
            spark,
        )
    line = one_line(refused.value)
    assert line == (
        f"endpoint {served.url} (model {tiny_causal_lm_dir}) does not honour generate.logprobs: the response "
        "holds no log-probabilities (the request's logprobs)"
    ), line
    assert not (tmp_path / "logprobs").exists()


def test_a_killed_endpoint_stops_the_run_in_one_line_and_the_rerun_resumes(spark, tmp_path, tiny_causal_lm_dir):
    source, output = tmp_path / "reviews", tmp_path / "summaries"
    frame = _reviews(9)
    _write(spark, frame, source)
    server = TransformersServe(tiny_causal_lm_dir, tmp_path / "serve.log").start()
    flags = {
        "generate.endpoint.url": server.url,
        "generate.endpoint.model": str(tiny_causal_lm_dir),
        "generate.endpoint.max_retries": 1,
        "generate.endpoint.max_consecutive_failures": 2,
        "generate.endpoint.concurrency": 1,
        "write.chunk_rows": 3,
        "run_id": "killed",
        "scoring.partitions": 1,
    }
    log = tmp_path / "serve.log"
    try:

        def kill_after_four_rows() -> None:  # the first chunk's three rows staged, the second's in flight
            deadline = time.monotonic() + 120
            while log.read_text(errors="replace").count("Request received") < 5 and time.monotonic() < deadline:
                time.sleep(0.05)
            server.kill()

        killer = threading.Thread(target=kill_after_four_rows, daemon=True)
        killer.start()
        with pytest.raises(Exception) as failed:
            run_scoring(_config(source, output, **flags), spark)
        killer.join()
        line = one_line(failed.value)
        assert line.startswith(
            f"endpoint {server.url} (model {tiny_causal_lm_dir}) failed 2 requests in a row; last: "
        ), line
        assert not output.exists()

        server.start()
        resumed = run_scoring(_config(source, output, **flags), spark)
        assert resumed.status == "succeeded", resumed.error
        assert resumed.chunks["skipped"] >= 1
        # the real server's /v1/models, recorded as it answered: transformers serve lists its hub cache (HTTP 500 where
        # there is none), never a model it serves from a path
        assert resumed.model_listing in ({"answered": False}, {"answered": True, "entry": None}), resumed.model_listing
        out = read_output(spark, str(output))
        assert out["generated_text"].tolist() == _expected(tiny_causal_lm_dir, frame)[0]
    finally:
        server.kill()


def test_a_served_engine_restarts_once_after_a_crash_and_stops_with_the_run(spark, tmp_path, tiny_causal_lm_dir):
    model = shutil.copytree(tiny_causal_lm_dir, tmp_path / "served-model")  # its path marks the engine's processes
    source, output = tmp_path / "reviews", tmp_path / "summaries"
    frame = _reviews(8)
    _write(spark, frame, source)
    engine_logs = list(Path(os.environ.get("TMPDIR", "/tmp")).glob("lakescore-engine-*.log"))
    started = {p: p.stat().st_size for p in engine_logs}

    def kill_the_engine_mid_run() -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            for path in Path(os.environ.get("TMPDIR", "/tmp")).glob("lakescore-engine-*.log"):
                text = path.read_text(errors="replace")[started.get(path, 0) :]
                if text.count("Request received") >= 3:
                    engines = [
                        pid for pid in python_processes_named(str(model)) if "remote.engine" not in _cmdline(pid)
                    ]
                    for pid in engines:
                        os.kill(pid, signal.SIGKILL)
                    killed.extend(engines)
                    return
            time.sleep(0.05)

    # another run's engine on this host, for the same model (its own copy marks its processes), owned by a live
    # process that is not this run's executor: the run's end must leave it serving (issue 57: it was stopped)
    neighbours_model = shutil.copytree(tiny_causal_lm_dir, tmp_path / "neighbours-model")
    neighbour = EngineServer(
        "transformers", str(neighbours_model), startup_timeout_s=300, owner=os.getpid(), watch_pid=os.getpid()
    )
    neighbour.url()
    killed: list[int] = []
    killer = threading.Thread(target=kill_the_engine_mid_run, daemon=True)
    killer.start()
    try:
        report = run_scoring(
            _config(
                source,
                output,
                **{
                    "model.source": str(model),
                    "generate.server.engine": "transformers",
                    "generate.server.concurrency": 1,
                    "scoring.partitions": 1,
                },
            ),
            spark,
        )
        killer.join()
        assert healthy(neighbour.port) and python_processes_named(str(neighbours_model))  # the neighbour still serves
    finally:
        neighbour.stop()
    assert report.status == "succeeded", report.error
    assert len(killed) == 1, killed  # the engine died mid-run, and was started again
    out = read_output(spark, str(output))
    assert out["generated_text"].tolist() == _expected(model, frame)[0]  # the rows in flight were sent again
    assert report.error_reasons == {"null_input": 1}
    deadline = time.monotonic() + 30
    while python_processes_named(str(model)):
        assert time.monotonic() < deadline, f"engine processes outlived the run: {python_processes_named(str(model))}"
        time.sleep(0.2)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _engine_processes(model: Path) -> set[int]:
    """The processes of the engine serving ``model`` (its watchdog and the server: their command lines hold the
    engine's ``serve <model>``, the CLI's ``--model <model>`` does not)."""
    return set(python_processes_named(f"serve {model} "))


def test_two_runs_with_served_engines_on_one_host_at_once_both_succeed(spark, tmp_path, tiny_causal_lm_dir):
    """Issue 57: a run's end stopped every engine on the host, so a concurrent run's engine died mid-run.

    Two CLI processes (two driver JVMs: two executors, each owning its engine) each serve their own copy of the model
    (its path marks the engine's processes). Both are held at ``score_stage`` (their preflights have started their
    engines and probed them); run A goes on to its end, which stops its engines, while run B still waits with all
    its rows to score; B's engine must still be the one it started, serving, when B goes on."""
    frame = _reviews(8)
    frame["body"] = frame["body"].fillna("the room was quiet")
    expected, _ = _expected(tiny_causal_lm_dir, frame)
    runs = {}
    for name in ("a", "b"):
        work = tmp_path / name
        work.mkdir()
        source, output = work / "reviews.parquet", work / "summaries"
        frame.to_parquet(source)
        model = shutil.copytree(tiny_causal_lm_dir, work / "model")
        command = [
            str(Path(sys.executable).with_name("lakescore")),
            "score",
            "--task",
            "generate",
            "--input",
            str(source),
            "--output",
            str(output),
            "--model",
            str(model),
            "--id-col",
            "review_id",
            "--prompt-template",
            TEMPLATE,
            "--max-new-tokens",
            "6",
            "--report",
            str(work / "run.json"),
            "--set",
            "generate.server.engine=transformers",
            "--set",
            "generate.server.concurrency=1",
            "--set",
            "scoring.partitions=1",
            "--set",
            "validation.enabled=false",
            "--set",
            "spark.master=local[1]",
            "--set",
            f"spark.warehouse_dir={work / 'warehouse'}",
            "--set",
            f"spark.metastore_dir={work / 'metastore'}",
            "--set",
            "spark.conf.spark.ui.enabled=false",
            "--set",
            "spark.conf.spark.sql.shuffle.partitions=1",
        ]
        barrier = work / "barrier"
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "HF_HUB_OFFLINE": "1",
            BARRIER_ENV: f"score_stage:2:{barrier}",
        }
        log = open(work / "cli.log", "wb")  # noqa: SIM115 (the run writes it while the test holds it at the barrier)
        process = subprocess.Popen(
            command, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        runs[name] = {
            "process": process,
            "log": log,
            "barrier": barrier,
            "model": model,
            "output": output,
            "work": work,
        }

    def cli_log(name: str) -> str:
        return (runs[name]["work"] / "cli.log").read_text(errors="replace")

    def wait_for(done, what: str, seconds: float = 300) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            exited = {n: r["process"].returncode for n, r in runs.items() if r["process"].poll() is not None}
            assert not exited or what.endswith("exit"), f"a run exited {exited} before {what}:\n" + "\n".join(
                cli_log(n)[-3000:] for n in exited
            )
            assert time.monotonic() < deadline, f"no {what} within {seconds:.0f} s"
            time.sleep(0.1)

    try:
        wait_for(lambda: all(list(r["barrier"].glob("arrived-*")) for r in runs.values()), "arrival of both runs")
        engines = {name: _engine_processes(run["model"]) for name, run in runs.items()}
        assert engines["a"] and engines["b"], engines  # each run's preflight started its own engine

        (runs["a"]["barrier"] / "arrived-test").write_text("")  # run A goes on to its end; B waits, nothing scored
        wait_for(lambda: runs["a"]["process"].poll() is not None, "run A's exit")
        assert runs["a"]["process"].returncode == 0, cli_log("a")[-5000:]
        # A's end stopped its own engine (its log says so, below) and not B's (issue 57: it did): the processes B's
        # preflight started are still there, none restarted
        assert _engine_processes(runs["b"]["model"]) == engines["b"], cli_log("a")[-3000:]

        (runs["b"]["barrier"] / "arrived-test").write_text("")  # run B scores every row on the engine it started
        wait_for(lambda: runs["b"]["process"].poll() is not None, "run B's exit")
        assert runs["b"]["process"].returncode == 0, cli_log("b")[-5000:]
    finally:
        for run in runs.values():
            if run["process"].poll() is None:
                os.killpg(run["process"].pid, signal.SIGKILL)
                run["process"].wait()
            run["log"].close()

    for name, run in runs.items():
        report = json.loads((run["work"] / "run.json").read_text())
        assert report["status"] == "succeeded", (name, report.get("error"))
        out = read_output(spark, str(run["output"]))
        assert out["review_id"].tolist() == frame["review_id"].tolist()  # every row scored and published
        assert out["generated_text"].tolist() == expected
        assert (
            not Path(f"{run['output']}_errors").exists()
            or spark.read.format("delta").load(f"{run['output']}_errors").count() == 0
        )
        assert "stopped 1 served engine(s)" in cli_log(name), cli_log(name)[-3000:]  # its own, once
    deadline = time.monotonic() + 30
    while any(_engine_processes(r["model"]) for r in runs.values()):  # no engine of either outlives its run
        assert time.monotonic() < deadline, {n: _engine_processes(r["model"]) for n, r in runs.items()}
        time.sleep(0.2)


def test_the_key_given_as_spark_executor_env_is_in_no_event_log_ui_table_or_report(spark, tmp_path, served, caplog):
    """Issue 57: with ``spark.eventLog.enabled`` and the key in ``spark.executorEnv.<NAME>``, the event log held it
    in plain text (the environment update, every job start and stage submission), as did the UI's Environment tab.
    The session lakescore builds redacts it; a session it did not build gets one warning line."""
    from lakescore.jobs.platform.spark.session import warn_if_shown

    with caplog.at_level("WARNING", logger="lakescore.jobs.platform.spark.session"):
        warn_if_shown(spark, [KEY_ENV])  # this test session was built without the name: it would show the key
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        f"this session's spark.redaction.regex does not match {KEY_ENV}"
    ]

    source, output, work = tmp_path / "reviews", tmp_path / "summaries", tmp_path / "run"
    _write(spark, _reviews(4), source)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.key_hidden_run",
            served.url,
            str(served.model_dir),
            str(source),
            str(output),
            str(work),
            KEY_ENV,
        ],
        input=KEY,
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != KEY_ENV},
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    environment = json.loads((work / "environment.json").read_text())
    shown = dict(map(tuple, environment["sparkProperties"]))
    assert shown[f"spark.executorEnv.{KEY_ENV}"] == "*********(redacted)"  # the key reached the executors, hidden
    assert list(work.glob("events/*")), "no event log was written"
    leaks = [str(p) for p in tmp_path.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert leaks == [] and KEY not in run.stdout + run.stderr
    for table in (output, Path(f"{output}_errors"), Path(f"{output}_metrics")):
        if table.exists():
            assert KEY not in spark.read.format("delta").load(str(table)).toPandas().to_json()


def test_images_with_a_prompt_through_an_endpoint_equal_in_process_greedy_and_a_bad_image_is_dead_lettered(
    spark, tmp_path
):
    """``--task generate --image-col`` over a folder, through ``transformers serve`` running the tiny LLaVA: each image
    goes as the chat API's ``image_url`` part before the prompt (a PNG and a JPEG as they are, a BMP and an RGBA PNG as
    PNG of the pixels lakescore decoded), each text and prompt token count equal to transformers' greedy ``generate`` by
    hand on the image lakescore decodes; a corrupt and an empty file are dead-lettered with the in-process reasons and
    never sent."""
    import torch
    import transformers

    from lakescore.udfs.images import decode_image
    from tests.tiny_vision import encoded, picture
    from tests.tiny_vlms import tiny_llava

    model_dir = tiny_llava(tmp_path / "llava")
    root = tmp_path / "photos"
    root.mkdir()
    files = {
        "1.png": encoded(picture(40, 30, 8), "PNG"),
        "2.jpg": encoded(picture(30, 44, 9), "JPEG", quality=90),
        "3.bmp": encoded(picture(36, 36, 10), "BMP"),
        "4.png": encoded(picture(33, 47, 11).convert("RGBA"), "PNG"),
        "5.png": b"not a png",
        "6.png": b"",
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    prompt = "Caption this product photo."
    server = TransformersServe(model_dir, tmp_path / "serve.log").start()
    try:
        report = run_scoring(
            load_config(
                flags={
                    "input": str(root),
                    "input_format": "images",
                    "output": str(tmp_path / "captions"),
                    "task": "generate",
                    "generate.prompt_template": prompt,
                    "generate.max_new_tokens": 6,
                    "max_error_rate": 0.5,
                    "spark.master": "local[2]",
                    "generate.endpoint.url": server.url,
                    "generate.endpoint.model": str(model_dir),
                    "generate.endpoint.api": "chat",
                }
            ),
            spark,
        )
    finally:
        server.kill()
    assert report.status == "succeeded", report.error
    assert report.error_reasons == {"invalid_image": 1, "null_input": 1}
    workers = report.workers  # the bad and the empty file cost no request
    assert workers["requests"] - workers["preflight"]["requests"] - workers["retries"] == 4
    out = spark.read.format("delta").load(str(tmp_path / "captions")).toPandas()
    out = out.assign(name=[p.rsplit("/", 1)[1] for p in out["path"]]).sort_values("name")
    assert out["name"].tolist() == ["1.png", "2.jpg", "3.bmp", "4.png"]
    processor = transformers.AutoProcessor.from_pretrained(model_dir)
    model = transformers.AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    same = []
    for name, text, tokens in zip(out["name"], out["generated_text"], out["prompt_tokens"]):
        messages = [
            {
                "role": "user",
                "content": [{"type": "image", "image": decode_image(files[name])}, {"type": "text", "text": prompt}],
            }
        ]
        inputs = processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
        with torch.no_grad():
            new = model.generate(**inputs, do_sample=False, max_new_tokens=6)[0, inputs["input_ids"].shape[1] :]
        assert tokens == inputs["input_ids"].shape[1]  # the server's usage: the image's tokens and the prompt's
        same.append(text == processor.decode(new, skip_special_tokens=True))
    assert all(same), same  # one engine (transformers) on both sides: no near-tie can split them
    errors = spark.read.format("delta").load(str(tmp_path / "captions_errors")).toPandas()
    reasons = dict(zip([p.rsplit("/", 1)[1] for p in errors["path"]], errors["reason"]))
    assert reasons == {"5.png": "invalid_image", "6.png": "null_input"}


def test_prompts_that_share_a_document_reach_the_endpoint_together_in_prompt_order(spark, tiny_causal_lm_dir):
    """Issue 68: an input stored in one partition, each document's questions scattered through it, reaches the
    scoring function by range of the rendered prompt, sorted within each task (``scoring.group_prefixes``), so a
    document's rows are sent together. The plan is read, not run (nothing is sent), and the partitioning it holds is
    run alone, in the JVM: seconds, no Python worker."""
    from pyspark.sql import functions as F

    from lakescore.jobs.steps.read import model_spec, render_prompts
    from lakescore.jobs.steps.score import grouped_by_prompt, score_dataframe
    from lakescore.schemas.contracts import PROMPT_COLUMN

    template = "Document: {doc}\nQuestion: {question}\nAnswer:"
    rows = [(d * 4 + q, f"doc {d} " + "word " * (3 + d), f"is it {q}?") for d in range(4) for q in range(4)]
    stored = [rows[i] for i in (5, 12, 0, 9, 14, 3, 7, 10, 1, 15, 6, 13, 2, 8, 11, 4)]  # documents interleaved
    source = spark.createDataFrame(stored, "id long, doc string, question string").coalesce(1)
    rendered = render_prompts(template, ("id",), source, "the test's rows")
    prompts = {i: template.format(doc=d, question=q) for i, d, q in rows}

    def scoring_plan(group: bool) -> str:
        flags = {
            "id_col": "id",
            "generate.prompt_template": template,
            "generate.endpoint.url": "http://127.0.0.1:9/v1",  # never called: the plan is only built
            "generate.endpoint.model": str(tiny_causal_lm_dir),
            "scoring.partitions": 2,
            "scoring.group_prefixes": group,
        }
        cfg = _config(Path("unused"), Path("unused-out"), **flags)
        scored = score_dataframe(rendered, cfg, model_spec(cfg), ["id"], (PROMPT_COLUMN,), key_col="id")
        return scored._jdf.queryExecution().executedPlan().toString()

    grouped, ungrouped = scoring_plan(True), scoring_plan(False)
    prompt = f"rangepartitioning({PROMPT_COLUMN}"
    assert prompt in grouped and f"Sort [{PROMPT_COLUMN}" in grouped, grouped
    assert prompt not in ungrouped and "roundrobinpartitioning(2)" in ungrouped.lower(), ungrouped
    # the grouping itself: each task's rows in the order the scoring function reads them, tasks in order
    tasks = grouped_by_prompt(rendered, 2, PROMPT_COLUMN).select(F.spark_partition_id().alias("task"), "id").collect()
    assert [prompts[r["id"]] for r in tasks] == sorted(prompts.values())
    assert {r["task"] for r in tasks} == {0, 1}  # ranges of the prompt over both tasks, not one
