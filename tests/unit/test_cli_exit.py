"""The console script's end: after a session on this host's own master, the objects alive are frozen out of the
interpreter's last garbage collection; after a cluster's session, nothing is (a local accelerator)."""

import subprocess
import sys

import pytest

from lakescore.jobs.cli import EXIT_OK

PROBE = """
import atexit, gc, sys
import lakescore.jobs.cli as cli
from lakescore.jobs.config import SparkConfig
from lakescore.jobs.platform.spark.local.own_host import own_host_tuning
own_host_tuning(SparkConfig(master={master!r}, class_archive=False), {{}})  # what session building asks
cli.main = lambda: {code}
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count()))
cli.run()
"""


def _run(code: int, master: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(code=code, master=master)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == code, result.stderr
    return int(result.stdout.split("frozen at exit:")[1])


@pytest.mark.parametrize("code", [EXIT_OK, 2])
def test_run_freezes_what_is_alive_and_still_exits_with_the_code_and_runs_atexit(code):
    assert _run(code, "local[2]") > 10_000  # every module lakescore.jobs.cli imported, at least


def test_a_cluster_masters_run_ends_with_the_interpreters_own_collection():
    assert _run(EXIT_OK, "spark://127.0.0.1:7077") == 0
