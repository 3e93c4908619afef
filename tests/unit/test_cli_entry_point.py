"""The ``lakescore`` entry point (console script and Databricks wheel task): failures must raise."""

import sys

import pytest

from lakescore.jobs.cli import EXIT_BAD_INPUT, run
from lakescore.jobs.platform.spark.jars import delta_coordinate


def test_a_failed_run_raises_system_exit_with_the_cli_code(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lakescore", "score", "--set", "task=summarize"])
    with pytest.raises(SystemExit) as exited:
        run()
    assert exited.value.code == EXIT_BAD_INPUT
    assert (
        "lakescore: error: task must be one of classify, embed, ner, image_classify, image_embed, tabular"
        in capsys.readouterr().err
    )


def test_a_successful_run_returns_normally(monkeypatch, tmp_path, capsys):
    # fetch-jars succeeds offline when the jars directory already holds a complete copy.
    cached = tmp_path / delta_coordinate().replace(":", "__")
    cached.mkdir()
    (cached / "delta.jar").write_bytes(b"")
    (cached / ".complete").write_text("done\n")
    monkeypatch.setattr(
        sys,
        "argv",
        ["lakescore", "fetch-jars", "--set", f"spark.jars_dir={tmp_path}", "--set", "spark.class_archive=false"],
    )
    assert run() is None
    assert "ready in" in capsys.readouterr().out
