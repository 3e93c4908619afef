"""The console script's end: the objects alive are frozen out of the interpreter's last garbage collection."""

import subprocess
import sys

import pytest

from lakescore.jobs.cli import EXIT_OK

PROBE = """
import atexit, gc, sys
import lakescore.jobs.cli as cli
cli.main = lambda: {code}
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count()))
cli.run()
"""


@pytest.mark.parametrize("code", [EXIT_OK, 2])
def test_run_freezes_what_is_alive_and_still_exits_with_the_code_and_runs_atexit(code):
    result = subprocess.run([sys.executable, "-c", PROBE.format(code=code)], capture_output=True, text=True, timeout=60)
    assert result.returncode == code, result.stderr
    frozen = int(result.stdout.split("frozen at exit:")[1])
    assert frozen > 10_000  # every module lakescore.jobs.cli imported, at least
