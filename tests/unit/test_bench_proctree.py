"""The bench's memory sampler counts each address space once (``bench.proctree``).

Real processes: a ``fork`` child (memory of its own) and a ``clone(CLONE_VM)`` child that runs
libc's ``pause`` in its parent's memory, as a JVM's ``posix_spawn`` child does until it execs.
"""

import ctypes
import os
import signal
import sys
import time

import pytest

from bench.proctree import run_measured, shares_parent_memory, tree_pids

CLONE_VM = 0x100


def test_a_forked_child_has_memory_of_its_own():
    child = os.fork()
    if child == 0:
        signal.pause()
        os._exit(0)
    try:
        assert not shares_parent_memory(child, os.getpid())
        assert child in tree_pids(os.getpid())
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine not in ("x86_64", "aarch64"), reason="kcmp is Linux")
def test_a_child_in_its_parents_memory_is_not_counted_again():
    libc = ctypes.CDLL(None, use_errno=True)
    stack = ctypes.create_string_buffer(1 << 16)
    top = ctypes.c_void_p(ctypes.addressof(stack) + len(stack) - 64)
    pause = ctypes.cast(libc.pause, ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p))
    libc.clone.argtypes = [
        ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p),
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    child = libc.clone(pause, top, CLONE_VM | signal.SIGCHLD, None)
    assert child > 0, os.strerror(ctypes.get_errno())
    try:
        assert shares_parent_memory(child, os.getpid())
        assert os.getpid() in tree_pids(os.getpid()) and child not in tree_pids(os.getpid())
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_a_run_returns_after_what_it_left_behind_exits_and_times_only_itself(tmp_path):
    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1.5)'])\n"
        "time.sleep(0.6)\n"
    )
    started = time.perf_counter()
    measured = run_measured(
        [sys.executable, "-c", script], env=os.environ, cwd=tmp_path, log_path=tmp_path / "log", poll_seconds=0.05
    )
    returned = time.perf_counter() - started
    assert measured.returncode == 0
    assert measured.wall_seconds < 1.4  # the child alone, not the grandchild's 1.5 s
    assert returned >= 1.5  # but the run came back only after the grandchild had exited
