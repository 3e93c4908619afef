"""vLLM's CPU build for the engine tier: where ``make engine-vllm`` puts it, a standalone server on loopback, its
offline ``LLM.generate`` as the reference, and the processes a server leaves (vLLM starts an API server, an engine
core and workers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from lakescore.udfs.remote.engine import HOST, free_port, healthy
from tests.served_models import live_processes

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / "build" / "engines" / "vllm" / "bin" / "python"
SKIP_REASON = (
    "build/engines/vllm is absent: run `make engine-vllm` (vLLM's CPU build, an environment of several GB, each engine "
    "taking minutes to start on 2 cores); CI does not build it, its time budget has no room for it"
)
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=SKIP_REASON)

STARTUP_S = 1200.0
"""vLLM loads, then compiles and warms up before /health answers: minutes on 2 cores, more on a shared machine."""
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
"""1 GiB of KV cache (vLLM's CPU default takes several), offline, no usage report."""
SERVE_ARGS = ("--dtype", "float32", "--max-model-len", "512", "--gpu-memory-utilization", "0.1")
"""The flags every engine of the tier runs with: float32 (the in-process reference's dtype); and a tenth of the host's
memory, which on the CPU backend vLLM checks is free at start (its default, 0.92, fails on a shared machine)."""


def equal_texts(ours: list[str], theirs: list[str]) -> tuple[int, int]:
    """How many rows hold the same text, and how many once a character cut at ``max_new_tokens`` is left out: vLLM's
    detokenizer holds back an incomplete UTF-8 sequence at the end, transformers' ``decode`` writes it as U+FFFD (a
    random byte-level model's texts end so often)."""
    same = sum(a == b for a, b in zip(ours, theirs))
    return same, sum(a.rstrip("\ufffd") == b.rstrip("\ufffd") for a, b in zip(ours, theirs))


def engine_env() -> dict[str, str]:
    return {**os.environ, **ENGINE_ENV}


def session_processes(sid: int) -> list[int]:
    """Live processes of session ``sid`` (a server started with ``start_new_session``: it and every child it forks)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def assert_sessions_end(sessions, seconds: float = 60.0) -> None:
    """Wait up to ``seconds`` for every process of the sessions ``sessions`` (servers and what they forked) to end;
    fail naming those still alive."""
    deadline = time.monotonic() + seconds
    left = [pid for sid in sessions for pid in session_processes(sid)]
    while left:
        assert time.monotonic() < deadline, f"vLLM processes outlived the run: {left}"
        time.sleep(0.5)
        left = [pid for sid in sessions for pid in session_processes(sid)]


def vllm_processes() -> list[str]:
    """Command lines of this user's live processes that run vLLM (the API server, ``VLLM::EngineCore`` and workers)."""
    return [command for _, command in live_processes() if "vllm" in command.lower()]


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` for ``model_dir`` with ``args`` on a free loopback port, in a
    session of its own; :meth:`stop` ends every process of that session."""

    def __init__(
        self, model_dir: Path, log: Path, name: str, args: Sequence[str] = SERVE_ARGS, env: Mapping[str, str] = {}
    ) -> None:
        self.model_dir, self.log, self.name, self.args, self.env = model_dir, log, name, tuple(args), dict(env)
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def start(self, timeout: float = STARTUP_S) -> VllmServer:
        command = [
            str(VLLM_PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.name,
            "--host",
            HOST,
            "--port",
            str(self.port),
            *self.args,
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**engine_env(), **self.env}, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not healthy(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vLLM did not start: {self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(1.0)
        return self

    def stop(self, grace: float = 30.0) -> None:
        if self.process is None:
            return
        sid = self.process.pid
        try:
            os.killpg(sid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while session_processes(sid) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in session_processes(sid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()


OFFLINE = """
import json, sys
from vllm import LLM, SamplingParams
spec = json.loads(sys.argv[1])
llm = LLM(model=spec["model"], dtype="float32", max_model_len=512, gpu_memory_utilization=0.1)
params = SamplingParams(temperature=0.0, max_tokens=spec["max_new_tokens"])
outputs = llm.generate(spec["prompts"], params, use_tqdm=False)
print("RESULT " + json.dumps([o.outputs[0].text for o in outputs]), flush=True)
"""


def start_offline_generate(model_dir: Path, prompts: list[str], max_new_tokens: int, log: Path) -> subprocess.Popen:
    """vLLM's own offline ``LLM.generate`` of ``prompts`` (greedy, the server's dtype and length), in the engine's
    environment; :func:`offline_texts` reads its answer."""
    spec = json.dumps({"model": str(model_dir), "prompts": prompts, "max_new_tokens": max_new_tokens})
    out = open(log, "wb")  # noqa: SIM115 (the engine's process writes it; offline_texts reads it)
    return subprocess.Popen(
        [str(VLLM_PYTHON), "-c", OFFLINE, spec],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=engine_env(),
        start_new_session=True,
    )


def offline_texts(process: subprocess.Popen, log: Path, timeout: float = STARTUP_S) -> list[str]:
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = log.read_text(errors="replace")
    line = next((row for row in text.splitlines() if row.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"vLLM's offline generate failed: {text[-3000:]}")
    return json.loads(line[len("RESULT ") :])
