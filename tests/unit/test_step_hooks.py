"""The test-only step hooks: unset they do nothing; the announce file records each point in order."""

from __future__ import annotations

from lakescore.jobs.platform import step_hooks


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
