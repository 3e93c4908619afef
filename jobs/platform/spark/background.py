"""One call run in a thread of its own, for the driver's work that overlaps other work (file lists, the report's
samples, drift figures, the metrics row): Spark accepts jobs from several threads and schedules them side by side."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["in_background"]


def in_background(name: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
    """Start ``call(*args, **kwargs)`` in a new thread named ``lakescore-<name>`` and return its future; the thread
    ends with the call."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lakescore-{name}")
    future = pool.submit(call, *args, **kwargs)
    pool.shutdown(wait=False)
    return future
