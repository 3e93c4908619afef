"""SIGINT / SIGTERM for the command line: stop the run's Spark jobs at once and say how to resume.

:func:`install` (the CLI calls it; a library caller's process keeps its own handlers) makes both
signals cancel every Spark job of the active session and raise ``KeyboardInterrupt`` in the main
thread. PySpark installs its own SIGINT handler when it starts a SparkContext, which also cancels
the jobs and raises ``KeyboardInterrupt``; py4j may then surface the interruption as its own error,
so :func:`was_interrupted` also looks at the exception chain.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["EXIT_INTERRUPTED", "install", "reinstall", "was_interrupted"]

EXIT_INTERRUPTED = 130
"""Exit code of an interrupted run (128 + SIGINT, as shells report it)."""

_received: list[int] = []
_installed: list[bool] = []


def install() -> None:
    """Handle SIGINT and SIGTERM in this process as described above (forgetting any signal seen before)."""
    _received.clear()
    _installed[:] = [True]
    reinstall()


def reinstall() -> None:
    """Put the handlers back after PySpark replaced them; nothing unless :func:`install` ran in this process."""
    if _installed and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _handle)


def _handle(signum: int, frame) -> None:
    # No py4j call here: the main thread is usually inside one, and py4j's socket is not reentrant.
    # The JVM is the CLI's child: it ends with this process (and a Ctrl-C reaches it directly).
    _received.append(signum)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def was_interrupted(exc: BaseException | None) -> bool:
    """True when a signal arrived, or ``KeyboardInterrupt`` is anywhere in ``exc``'s chain."""
    if _received:
        return True
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
