"""A requests-per-minute and tokens-per-minute limit shared by every process of one host that calls one endpoint.

Spark runs each concurrent task of an executor in its own Python worker process, so a limit held in one process's
memory would let each task spend the whole allowance. The allowance lives in a small file instead: two token buckets
(requests, tokens) refilled continuously at their per-minute rates, read and debited under a file lock (``filelock``).
A bucket starts full, so a run may burst one minute's allowance, as the providers' own limits allow.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

__all__ = ["HostRateLimit"]


class HostRateLimit:
    """Per-minute allowances of requests and tokens for the endpoint named by ``key``, shared by this host's processes.

    ``requests_per_minute`` / ``tokens_per_minute``: ``None`` for no limit of that kind. :meth:`acquire` blocks until
    one request of an estimated ``tokens`` fits; :meth:`settle` corrects the estimate once the response's ``usage``
    says what the request really cost.
    """

    def __init__(
        self,
        key: str,
        requests_per_minute: int | None,
        tokens_per_minute: int | None,
        folder: Path | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rpm, self.tpm = requests_per_minute, tokens_per_minute
        digest = hashlib.sha256(f"{key}\x00{requests_per_minute}\x00{tokens_per_minute}".encode()).hexdigest()[:16]
        self.path = Path(folder or tempfile.gettempdir()) / f"lakescore-rate-{digest}.json"
        self.lock = FileLock(str(self.path.with_suffix(".lock")))
        self.clock, self.sleep = clock, sleep
        self.waited = 0.0
        """Seconds this process spent waiting for the allowance."""

    @property
    def limited(self) -> bool:
        return bool(self.rpm or self.tpm)

    def acquire(self, tokens: int) -> None:
        """Take one request and ``tokens`` tokens from the allowance, waiting until they are there. A request of more
        tokens than a minute's allowance waits for a full bucket and then takes it all (it could never fit
        otherwise)."""
        if not self.limited:
            return
        while True:
            wait = self._update(lambda state: self._take(state, tokens))
            if wait <= 0:
                return
            self.waited += wait
            self.sleep(wait)

    def settle(self, estimated: int, actual: int) -> None:
        """Debit (or give back) the difference between a request's ``estimated`` and ``actual`` tokens."""
        tpm = self.tpm
        if tpm and actual != estimated:

            def debit(state: dict) -> float:
                state["tokens"] = min(float(tpm), state["tokens"] - (actual - estimated))
                return 0.0

            self._update(debit)

    def _take(self, state: dict, tokens: int) -> float:
        """Debit ``state`` when one request of ``tokens`` fits and return 0; else the seconds until it fits."""
        waits = [0.0]
        if self.rpm and state["requests"] < 1:
            waits.append((1 - state["requests"]) * 60.0 / self.rpm)
        if self.tpm:
            need = min(float(tokens), float(self.tpm))
            if state["tokens"] < need:
                waits.append((need - state["tokens"]) * 60.0 / self.tpm)
        wait = max(waits)
        if wait <= 0:
            state["requests"] -= 1
            state["tokens"] -= float(tokens)
        return wait

    def _update(self, change: Callable[[dict], float]) -> float:
        """Read the buckets under the host-wide lock, refill them for the time passed, apply ``change``, write back."""
        with self.lock:
            now = self.clock()
            try:
                state = json.loads(self.path.read_text())
            except (OSError, ValueError):  # none yet, or a torn write from a killed process: start full again
                state = None
            if state is None:
                state = {"at": now, "requests": float(self.rpm or 0), "tokens": float(self.tpm or 0)}
            passed = max(0.0, now - state["at"])
            if self.rpm:
                state["requests"] = min(float(self.rpm), state["requests"] + passed * self.rpm / 60.0)
            if self.tpm:
                state["tokens"] = min(float(self.tpm), state["tokens"] + passed * self.tpm / 60.0)
            state["at"] = now
            result = change(state)
            self.path.write_text(json.dumps(state))
            return result
