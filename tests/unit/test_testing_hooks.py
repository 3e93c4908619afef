"""The test-only step hooks: unset they do nothing; the announce file records each point in order; without
the suite's switch (``LAKESCORE_TEST_HOOKS=1``) even a set kill or announce variable does nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from lakescore.jobs import testing_hooks as step_hooks


def test_unset_hooks_neither_write_nor_kill(tmp_path, monkeypatch):
    for env in (step_hooks.ANNOUNCE_ENV, step_hooks.BARRIER_ENV, step_hooks.KILL_ENV):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.chdir(tmp_path)
    step_hooks.at_step("validate")
    step_hooks.at_point("publish_commit")
    assert list(tmp_path.iterdir()) == []  # still alive, nothing written


def test_announce_appends_each_point_with_its_time(tmp_path, monkeypatch):
    announce = tmp_path / "points"
    monkeypatch.setenv(step_hooks.ANNOUNCE_ENV, str(announce))
    monkeypatch.setenv(step_hooks.KILL_ENV, "some_other_point")
    step_hooks.at_step("validate")
    step_hooks.at_point("validation_running")
    step_hooks.at_point("publish_commit")
    lines = [line.split() for line in announce.read_text().splitlines()]
    assert [name for name, _ in lines] == ["validate", "validation_running", "publish_commit"]
    times = [float(t) for _, t in lines]
    assert times == sorted(times)


def test_hooks_stay_off_without_the_suites_switch(tmp_path, monkeypatch):
    announce = tmp_path / "points"
    monkeypatch.delenv(step_hooks.ENABLE_ENV)
    monkeypatch.setenv(step_hooks.ANNOUNCE_ENV, str(announce))
    monkeypatch.setenv(step_hooks.BARRIER_ENV, f"validate:2:{tmp_path / 'barrier'}")
    step_hooks.at_step("validate")  # would wait for a second party if the barrier were on
    step_hooks.at_point("publish_commit")
    assert list(tmp_path.iterdir()) == []


def test_kill_needs_the_suites_switch():
    """A process with ``LAKESCORE_TEST_KILL`` naming the point it reaches lives on without the switch, dies with it."""
    code = "from lakescore.jobs.testing_hooks import at_point; at_point('publish_commit'); print('alive')"
    env = {k: v for k, v in os.environ.items() if k != step_hooks.ENABLE_ENV}
    env[step_hooks.KILL_ENV] = "publish_commit"
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert (off.returncode, off.stdout.strip()) == (0, "alive"), off.stderr
    on = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, step_hooks.ENABLE_ENV: "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert on.returncode == -9 and "alive" not in on.stdout
