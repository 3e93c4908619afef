"""The served engine's launcher without an engine: the command line each engine is started with (vLLM and SGLang
cannot run here; their lines are checked for what they say), and the watchdog that stops an engine when the process
it watches ends. The real lifecycle with ``transformers serve`` is tests/integration/test_endpoint_job.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lakescore.udfs.remote.engine import (
    EngineServer,
    _alive,
    engine_command,
    engine_gpus,
    executor_pid,
    first_error,
    free_port,
    served_name,
    tensor_parallel_size,
)


def test_each_engines_command_line_serves_the_model_on_loopback_with_the_users_flags_last():
    assert engine_command("vllm", "/models/qwen", "qwen", 8123, ["--max-model-len", "4096"])[1:] == [
        "serve",
        "/models/qwen",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--served-model-name",
        "qwen",
        "--max-model-len",
        "4096",
    ]
    assert Path(engine_command("vllm", "m", "m", 1)[0]).name == "vllm"
    assert engine_command("sglang", "/models/qwen", "qwen", 8124, ["--tp", "2"]) == [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/qwen",
        "--host",
        "127.0.0.1",
        "--port",
        "8124",
        "--served-model-name",
        "qwen",
        "--tp",
        "2",
    ]
    line = engine_command("transformers", "/models/tiny", "/models/tiny", 8125, ["--dtype", "float32"])
    assert Path(line[0]).name == "transformers" and line[1:] == [
        "serve",
        "/models/tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "8125",
        "--dtype",
        "float32",
    ]
    with pytest.raises(ValueError, match="vllm, sglang, transformers"):
        engine_command("tgi", "m", "m", 1)


def test_requests_name_the_model_as_each_engine_knows_it():
    assert served_name("vllm", "/models/qwen-7b/") == "qwen-7b"
    assert served_name("sglang", "org/model") == "model"
    assert served_name("transformers", "/models/tiny") == "/models/tiny"


def test_one_state_file_per_engine_model_flags_executor_and_gpu():
    a, b = EngineServer("vllm", "/m", ["--x"], owner=11), EngineServer("vllm", "/m", ["--x"], owner=11)
    assert a.state_path == b.state_path and a.lock_path == b.lock_path  # one executor's workers share one engine
    assert EngineServer("vllm", "/m", ["--y"], owner=11).state_path != a.state_path
    assert EngineServer("vllm", "/m", ["--x"], owner=12).state_path != a.state_path  # another run's executor: its own
    gpu0, gpu1 = (EngineServer("vllm", "/m", ["--x"], owner=11, gpus=[g]) for g in ("0", "1"))
    assert len({gpu0.state_path, gpu1.state_path, a.state_path}) == 3 and gpu1.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert EngineServer("vllm", "/m").owner == executor_pid()
    assert 0 < free_port() < 65536


def test_each_gpu_a_task_holds_gets_its_own_engine_unless_the_args_ask_for_tensor_parallelism():
    assert engine_gpus([], ("0",)) == ("0",) and engine_gpus([], ("3",)) == ("3",)
    assert engine_gpus(["--max-model-len", "4096"], ("2", "5")) == ("2",)  # one engine per GPU: the task's first
    assert engine_gpus([], ()) is None  # no GPU: the engine sees what the executor sees
    assert tensor_parallel_size(["--tensor-parallel-size", "2"]) == 2 and tensor_parallel_size(["-tp=4"]) == 4
    assert tensor_parallel_size(["--tp-size", "2"]) == 2 and tensor_parallel_size(["--tp", "x"]) == 1
    assert tensor_parallel_size(["--dtype", "float32"]) == 1
    assert engine_gpus(["--tensor-parallel-size", "2"], ("4", "5", "6")) == ("4", "5")  # one engine spans them
    assert engine_gpus(["--tensor-parallel-size", "1"], ("4", "5")) == ("4",)
    assert engine_gpus(["--tp", "4"], ("4", "5")) is None  # the task holds fewer: the engine sees the executor's


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)


def test_a_run_stops_only_its_own_engines_and_those_left_behind_never_a_live_neighbours(tmp_path):
    """Before: stop_engines stopped every engine of the host, other runs' included, and counted one engine once per
    task that found it."""
    import json

    from lakescore.udfs.remote.engine import stop_engines

    mine, neighbour, neighbours_engine, orphan = _sleeper(), _sleeper(), _sleeper(), _sleeper()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a driver that was killed: its executor is no more
    try:
        my_engine = _sleeper()
        for name, engine, owner in (
            ("a", my_engine, mine.pid),
            ("b", neighbours_engine, neighbour.pid),
            ("c", orphan, gone.pid),
        ):
            (tmp_path / f"lakescore-engine-{name}.json").write_text(
                json.dumps({"pid": engine.pid, "pgid": engine.pid, "port": 1, "owner": owner})
            )
        started = time.monotonic()
        assert stop_engines(owner=mine.pid, folder=tmp_path) == 1  # its own, counted once
        # the stopped processes are zombies until their parent (here: this test) reaps them, as an engine's watchdog is
        # when another worker stops it: not waited for (before: the whole 15 s grace, for each engine)
        assert time.monotonic() - started < 10
        assert stop_engines(owner=mine.pid, folder=tmp_path) == 0
        for process in (my_engine, orphan):
            process.wait(timeout=20)
        assert neighbours_engine.poll() is None and _alive(neighbours_engine.pid)  # a live run's engine: untouched
        assert sorted(p.name for p in tmp_path.glob("*.json")) == ["lakescore-engine-b.json"]
    finally:
        for process in (mine, neighbour, neighbours_engine, orphan, my_engine):
            process.kill()
            process.wait()


def test_the_watchdog_stops_its_engine_when_the_watched_process_ends():
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    engine_pid_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"lakescore-watch-{os.getpid()}.pid"
    engine = f"import os, time; open({str(engine_pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    watchdog = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lakescore.udfs.remote.engine",
            "watch",
            str(parent.pid),
            "--",
            sys.executable,
            "-c",
            engine,
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not engine_pid_file.exists() or not engine_pid_file.read_text():
            assert time.monotonic() < deadline, "the engine never started"
            time.sleep(0.1)
        engine_pid = int(engine_pid_file.read_text())
        assert _alive(engine_pid)
        parent.kill()
        parent.wait()
        assert watchdog.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while _alive(engine_pid):
            assert time.monotonic() < deadline, "the engine outlived its watchdog"
            time.sleep(0.1)
    finally:
        parent.kill()
        watchdog.kill()
        engine_pid_file.unlink(missing_ok=True)


def test_generate_server_python_runs_each_engine_as_a_module_of_that_interpreter(tmp_path):
    python = "/envs/vllm/bin/python"
    assert engine_command("vllm", "/models/q", "q", 8123, ["--dtype", "float32"], python=python) == [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/q",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--served-model-name",
        "q",
        "--dtype",
        "float32",
    ]
    assert engine_command("sglang", "/models/q", "q", 8124, python=python)[:3] == [python, "-m", "sglang.launch_server"]
    assert engine_command("transformers", "/m", "/m", 8125, python=python) == [
        python,
        "-m",
        "transformers.cli.transformers",
        "serve",
        "/m",
        "--host",
        "127.0.0.1",
        "--port",
        "8125",
    ]
    # the module form serves as the command does: the job's own interpreter runs transformers serve that way
    from lakescore.udfs.options.remote import ServerOptions

    assert ServerOptions(engine="vllm").python is None  # unset: today's commands
    assert (
        ServerOptions(engine="vllm", python="build/engines/vllm/bin/python").python == "build/engines/vllm/bin/python"
    )
    # an interpreter that is not there: one line naming it, before anything is started
    missing = EngineServer("transformers", "/m", python=str(tmp_path / "nope" / "python"))
    from lakescore.udfs.remote.engine import EngineStartError

    with pytest.raises(EngineStartError, match=r"^generate.server.python: .*nope/python is not an executable on "):
        missing.url()
    assert missing.state_path != EngineServer("transformers", "/m").state_path  # another environment, another engine


def test_an_engine_killed_outright_leaves_none_of_its_children_behind(tmp_path):
    # vLLM's API server forks an engine core and workers: SIGKILL the server and they stay, unless the watchdog ends
    # them
    pids = tmp_path / "pids"
    engine = (
        "import os, subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
        f"time.sleep(120)']); open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}'); time.sleep(120)"
    )
    watchdog = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lakescore.udfs.remote.engine",
            "watch",
            str(os.getpid()),
            "--",
            sys.executable,
            "-c",
            engine,
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not pids.exists() or len(pids.read_text().split()) < 2:
            assert time.monotonic() < deadline, "the engine never started"
            time.sleep(0.1)
        server, child = map(int, pids.read_text().split())
        os.kill(server, 9)
        assert watchdog.wait(timeout=30) != 0  # the engine's own end
        assert not _alive(child), "the engine's child outlived it"
    finally:
        watchdog.kill()


def test_the_engines_first_error_line_is_its_root_cause():
    vllm = (
        "(APIServer pid=1) WARNING [system_utils.py:255] Found ulimit of 20000 and failed with error current limit\n"
        "(Worker pid=7) ERROR 11-28 19:33:00 [multiproc_executor.py:1063] Traceback (most recent call last):\n"
        "(Worker pid=7) ERROR 11-28 19:33:00 [multiproc_executor.py:1063] RuntimeError: Unsupported CPU attention "
        "configuration: head_dim=16 isa=2\n"
        "(APIServer pid=1) ERROR [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered "
        "an issue. See stack trace (above) for the root cause.\n"
    )
    assert first_error(vllm) == "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2"
    assert first_error("usage: api_server.py [-h]\napi_server.py: error: unrecognized arguments: --bogus\n") == (
        "error: unrecognized arguments: --bogus"
    )
    assert first_error("INFO: Started server process\nDeprecationWarning: old\n") is None
    pydantic = (
        "E pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, User-specified max_model_len (512) is greater than the derived max_model_len\n"
    )
    assert first_error(pydantic) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig: "
        "Value error, User-specified max_model_len (512) is greater than the derived max_model_len"
    )
