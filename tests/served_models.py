"""Real OpenAI-compatible servers for tests: ``transformers serve`` over a tiny model on loopback (offline), and a
small proxy in front of one that answers some requests 429 with ``Retry-After``, as a rate-limited endpoint does."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from lakescore.udfs.remote.engine import HOST, engine_command, free_port, healthy


class TransformersServe:
    """``transformers serve <model_dir>`` on a free loopback port, offline; :meth:`kill` and :meth:`start` again."""

    def __init__(self, model_dir: Path, log: Path) -> None:
        self.model_dir, self.log = model_dir, log
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def start(self, timeout: float = 180.0) -> TransformersServe:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        command = engine_command("transformers", str(self.model_dir), str(self.model_dir), self.port)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not healthy(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.3)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextmanager
def transformers_serve(model_dir: Path, log: Path) -> Iterator[TransformersServe]:
    server = TransformersServe(model_dir, log).start()
    try:
        yield server
    finally:
        server.kill()


class RateLimitingProxy:
    """Forwards ``/v1`` requests to ``upstream``; each ``POST`` whose number (from 1) is a multiple of ``every`` is
    answered 429 with ``Retry-After: <retry_after>`` instead, and counted in :attr:`refused`. With :attr:`models` set,
    ``GET /v1/models`` is answered with it (a server whose list of models the test changes) instead of upstream's."""

    def __init__(self, upstream_port: int, every: int = 3, retry_after: int = 1) -> None:
        proxy = self
        self.upstream_port, self.every, self.retry_after = upstream_port, every, retry_after
        self.models: dict | None = None
        self.models_status: int | None = None
        """With a status set, ``GET /v1/models`` is answered with it and no listing (an outage of the listing alone)."""
        self.requests = self.posts = self.refused = 0
        self.authorizations: list[str] = []
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def _forward(self, body):
                with proxy.lock:
                    proxy.requests += 1
                    proxy.posts += body is not None
                    refuse = body is not None and proxy.posts % proxy.every == 0
                    proxy.refused += refuse
                    proxy.authorizations.append(self.headers.get("Authorization") or "")
                if refuse:
                    data = b'{"error": {"message": "rate limited"}}'
                    self.send_response(429)
                    self.send_header("Retry-After", str(proxy.retry_after))
                elif body is None and self.path.rstrip("/") == "/v1/models" and proxy.models_status is not None:
                    data = b'{"error": {"message": "unavailable"}}'
                    self.send_response(proxy.models_status)
                elif body is None and self.path.rstrip("/") == "/v1/models" and proxy.models is not None:
                    data = json.dumps(proxy.models).encode()
                    self.send_response(200)
                else:
                    upstream = http.client.HTTPConnection(HOST, proxy.upstream_port, timeout=120)
                    upstream.request(self.command, self.path, body=body, headers={"Content-Type": "application/json"})
                    answer = upstream.getresponse()
                    data = answer.read()
                    upstream.close()
                    self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer((HOST, 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def __enter__(self) -> RateLimitingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def live_processes() -> list[tuple[int, str]]:
    """``(pid, command line)`` of this user's processes that are running (zombies left out), this one aside."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status", "uids"]):
        info = proc.info
        if info["pid"] == os.getpid() or info["status"] == psutil.STATUS_ZOMBIE or info["uids"] is None:
            continue
        if info["uids"].real == os.getuid() and info["cmdline"]:
            found.append((info["pid"], " ".join(info["cmdline"])))
    return found


def python_processes_named(marker: str) -> list[int]:
    """Pids of this user's processes whose command line holds ``marker`` (an engine's model path), this one aside."""
    return [pid for pid, command in live_processes() if marker in command]


__all__ = ["TransformersServe", "transformers_serve", "RateLimitingProxy", "live_processes", "python_processes_named"]
