"""``--task generate`` with ``generate.server.engine: vllm``: lakescore starts vLLM's CPU build itself
(``generate.server.python`` pointing at ``build/engines/vllm``), on real Spark + Delta.

* the engine killed mid-run: started again, the rows in flight sent again, every row scored with the texts vLLM gives,
  and no process of either engine left when the run ends (vLLM's API server, its engine core and workers);
* an engine that cannot start (a head_dim vLLM's CPU attention refuses) ends the run in one line quoting vLLM's own
  error.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from lakescore.jobs.config import load_config
from lakescore.jobs.report.text import one_line
from lakescore.jobs.score_job import run_scoring
from tests.engines.vllm_engine import (
    ENGINE_ENV,
    SERVE_ARGS,
    STARTUP_S,
    VLLM_PYTHON,
    assert_sessions_end,
    equal_texts,
    needs_vllm,
)
from tests.integration.test_generate_job import _reference_texts
from tests.integration.test_score_job import read_output

pytestmark = needs_vllm

TEMPLATE = "Review: {body}\nSummary:"
NEW_TOKENS = 8


@pytest.fixture(autouse=True)
def engine_env(monkeypatch):
    """The engine inherits the worker's environment: 1 GiB of KV cache, offline (the session's workers start after)."""
    for name, value in ENGINE_ENV.items():
        monkeypatch.setenv(name, value)


def _write(spark, frame, path):
    spark.createDataFrame(frame, "review_id long, body string").write.format("delta").mode("overwrite").save(str(path))


def _config(source, output, model, **flags):
    return load_config(
        flags={
            "input": str(source),
            "output": str(output),
            "task": "generate",
            "id_col": "review_id",
            "model.source": str(model),
            "generate.prompt_template": TEMPLATE,
            "generate.max_new_tokens": NEW_TOKENS,
            "spark.master": "local[2]",
            "scoring.partitions": 1,
            "generate.server.engine": "vllm",
            "generate.server.python": str(
                VLLM_PYTHON.relative_to(Path.cwd()) if VLLM_PYTHON.is_relative_to(Path.cwd()) else VLLM_PYTHON
            ),
            "generate.server.args": list(SERVE_ARGS),
            "generate.server.startup_timeout_s": STARTUP_S,
            **flags,
        }
    )


def _api_servers(model: Path) -> dict[int, int]:
    """The vLLM API servers serving ``model``: pid -> its session (the engine's watchdog's)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        server = command.split()[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # (not its watchdog)
        if server and str(model) in command and fields[0] != "Z":
            found[int(entry.name)] = int(fields[3])
    return found


def test_a_served_vllm_killed_mid_run_is_restarted_and_leaves_no_process(spark, tmp_path, vllm_llama_dir):
    import shutil

    model = shutil.copytree(vllm_llama_dir, tmp_path / "served-llama")  # its path marks this test's engines
    source, output = tmp_path / "reviews", tmp_path / "summaries"
    from tests.tiny_generators import reviews

    frame = pd.DataFrame(list(enumerate(reviews(16, seed=11), start=1)), columns=["review_id", "body"])
    _write(spark, frame, source)
    sessions: set[int] = set()
    killed: list[int] = []

    ended = threading.Event()
    # engines append to their host's log, one file per model path: a past run's lines (a reused pytest directory) are
    # not this run's requests
    logs_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    before = {p: p.stat().st_size for p in logs_dir.glob("lakescore-engine-*.log")}

    def new_lines(path: Path) -> str:
        with open(path, "rb") as log:
            log.seek(before.get(path, 0))
            return log.read().decode(errors="replace")

    def kill_the_engine_mid_run() -> None:  # once the engine answered some rows: its API server, SIGKILL; then watch
        while not ended.is_set():  # every engine's session, the restarted one's too, until the run ends
            servers = _api_servers(model)
            sessions.update(servers.values())
            logs = [new_lines(p) for p in logs_dir.glob("lakescore-engine-*.log")]
            # (this engine's log: other runs' engines on the host log requests too)
            if (
                not killed
                and servers
                and any(str(model) in log and log.count("POST /v1/completions") >= 4 for log in logs)
            ):
                for pid in servers:
                    os.kill(pid, signal.SIGKILL)
                killed.extend(servers)
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_engine_mid_run, daemon=True)
    killer.start()
    try:
        report = run_scoring(_config(source, output, model, **{"generate.server.concurrency": 2}), spark)
    finally:
        ended.set()
        killer.join()
    sessions.update(_api_servers(model).values())
    assert report.status == "succeeded", report.error
    assert len(killed) == 1, killed
    out = read_output(spark, str(output))
    assert len(out) == len(frame) and not report.error_reasons
    expected, _ = _reference_texts(model, [TEMPLATE.format(body=b) for b in frame["body"]], NEW_TOKENS)
    same, same_but_cut = equal_texts(out["generated_text"].tolist(), expected)
    print(
        f"served vLLM vs transformers' in-process greedy: {same} of {len(expected)} texts equal, {same_but_cut} but "
        "for a last character cut at max_new_tokens"
    )
    assert same_but_cut / len(expected) >= 0.75
    assert_sessions_end(sessions)
    assert len(sessions) == 2  # the first engine and the one started after the kill


def test_an_engine_that_cannot_start_ends_the_run_quoting_vllms_error(spark, tmp_path):
    from tests.tiny_generators import reviews, save_causal, train_tokenizer

    model = save_causal(tmp_path / "head-dim-16", train_tokenizer("bos"))  # hidden 64 over 4 heads
    source, output = tmp_path / "reviews", tmp_path / "out"
    _write(spark, pd.DataFrame({"review_id": [1, 2], "body": reviews(2, seed=3)}), source)
    args = ["--dtype", "float32", "--max-model-len", "128", "--gpu-memory-utilization", "0.1"]  # (its 160 positions)
    with pytest.raises(Exception) as failed:
        run_scoring(
            _config(source, output, model, **{"generate.max_new_tokens": 4, "generate.server.args": args}), spark
        )
    line = one_line(failed.value)
    assert "head_dim=16" in line, line
    assert "\n" not in line and not output.exists()
    assert not _api_servers(model)
