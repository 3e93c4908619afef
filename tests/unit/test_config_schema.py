"""One schema, every surface: the CLI's flags, the Python API's keywords, the worker's model spec and the
reference in docs/configuration.md all follow the schema in jobs/config/."""

import dataclasses
from pathlib import Path

import pytest

from lakescore.jobs.config import ConfigError, ModelConfig, ScoringConfig, config_options, load_config

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_reference_is_what_the_schema_generates():
    from lakescore.jobs.config.reference import updated

    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == updated(page), "docs/configuration.md is stale: run `make docs`"


def test_the_reference_names_every_key_with_its_flag_and_default():
    from lakescore.jobs.config.reference import reference

    rows = {line.split(" | ")[0].strip("| `"): line for line in reference().splitlines() if line.startswith("| `")}
    assert set(rows) == {o.key for o in config_options()}
    assert "| `--write-mode` | one of `overwrite`, `replace_run`, `incremental` | `overwrite` |" in rows["write.mode"]
    assert "| number between 0 and 1 | `0.001` |" in rows["max_error_rate"]
    assert "| mapping: name → number between 0 and 1 | `{}` |" in rows["validation.max_null_fraction"]


def test_every_model_spec_field_comes_from_the_model_config_by_name():
    from lakescore.jobs.steps.read import model_spec
    from lakescore.udfs.models.model_source import ModelSpec

    # From the job, not the model section: `generate`, `embed` and `transcribe` are the tasks' own sections;
    # `input_kind` the job's, by its column settings.
    derived = {"task", "feature_cols", "generate", "embed", "transcribe", "input_kind"}
    spec_fields = {f.name for f in dataclasses.fields(ModelSpec)}
    assert spec_fields - derived <= set(ModelConfig.model_fields), "a ModelSpec field the config cannot set"

    # Every shared setting away from its default reaches the spec; the digest pin arrives lower-cased.
    cfg = load_config(
        overrides=[
            "model.source=/m",
            "model.revision=v2",
            "model.device=auto",
            "model.dtype=bfloat16",
            "model.max_seq_length=64",
            "model.pooling=cls",
            "model.normalize=false",
            "model.prompt_name=query",
            "model.allow_pickle=true",
            "model.trust_remote_code=true",
            f"model.expect_sha256={'AB' * 32}",
            "model.cache_dir=/c",
            "task=embed",
        ]
    )
    spec = model_spec(cfg, ())
    for name in spec_fields - derived - {"expect_sha256", "backend", "quantize"}:
        assert getattr(spec, name) == getattr(cfg.model, name) != getattr(ModelSpec, name, object()), name
    assert spec.expect_sha256 == "ab" * 32 and spec.task == "embed"
    onnx = model_spec(load_config(overrides=["model.backend=onnx", "model.quantize=int8"]))
    assert (onnx.backend, onnx.quantize) == ("onnx", "int8")


def test_score_flags_are_generated_from_the_schema():
    from lakescore.jobs.cli import _config_flags, _parser

    flagged = [o for o in config_options() if o.flag]
    assert {o.flag for o in flagged} >= {
        "--input",
        "--model",
        "--text-col",
        "--write-mode",
        "--full-rescore",
        "--remote",
    }
    args = _parser().parse_args(
        [
            "score",
            "--model",
            "/m",
            "--feature-cols",
            "a, b",
            "--task",
            "tabular",
            "--device",
            "auto",
            "--allow-pickle",
            "--write-mode",
            "incremental",
            "--full-rescore",
            "--run-date",
            "2026-11-20",
        ]
    )
    flags = _config_flags(args)
    assert set(flags) == {o.key for o in flagged}
    assert (
        flags["model.source"] == "/m"
        and flags["write.full_rescore"] is True
        and flags["model.trust_remote_code"] is None
    )
    cfg = load_config(flags=flags)
    assert (cfg.model.source, cfg.feature_cols, cfg.model.device, cfg.run_date) == (
        "/m",
        ("a", "b"),
        "auto",
        "2026-11-20",
    )
    assert cfg.model.allow_pickle and not cfg.model.trust_remote_code and cfg.write.full_rescore


@pytest.mark.parametrize(
    "argv, refusal",
    [
        (["score", "--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
        (["score", "--task", "summarize"], "argument --task: invalid choice: 'summarize'"),
        (["sweep", "--write-mode", "overwrite"], "unrecognized arguments: --write-mode overwrite"),
    ],
)
def test_flag_choices_come_from_the_schema_and_sweep_takes_its_subset(argv, refusal, capsys):
    from lakescore.jobs.cli import _parser

    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(argv)
    assert exited.value.code == 2 and refusal in capsys.readouterr().err


def test_sweep_flags_are_the_schema_fields_marked_for_it():
    from lakescore.jobs.cli import _config_flags, _parser

    args = _parser().parse_args(["sweep", "--model", "/m", "--text-col", "body", "--report", "sweep.json"])
    assert set(_config_flags(args)) == {o.key for o in config_options() if o.sweep}
    assert _config_flags(args)["model.source"] == "/m" and args.report == "sweep.json"  # sweep's own --report


def test_notebook_keywords_are_the_model_scoring_and_task_fields():
    from lakescore.jobs.api import _OPTIONS, _notebook_config
    from lakescore.jobs.config import GenerateConfig, TranscribeConfig

    assert set(_OPTIONS) == (
        (set(ModelConfig.model_fields) - {"source"})
        | set(ScoringConfig.model_fields)
        | set(GenerateConfig.model_fields)
        | set(TranscribeConfig.model_fields)
        | {"chunk"}
    )  # embed's one field: its chunk section
    cfg = _notebook_config("generate", "/m", None, {"max_new_tokens": 5, "choices": ["yes", "no"]}, text_col="prompt")
    assert cfg.task_options().max_new_tokens == 5 and cfg.task_options().choices == ("yes", "no")
    cfg = _notebook_config(
        "embed", "/m", None, {"device": "auto", "max_seq_length": 64, "max_batch_rows": 8, "cache_dir": "/c"}
    )
    assert (cfg.model.device, cfg.model.max_seq_length, cfg.scoring.max_batch_rows, cfg.model.cache_dir) == (
        "auto",
        64,
        8,
        "/c",
    )
    with pytest.raises(ConfigError, match=r"unknown option 'max_batch_token'; did you mean 'max_batch_tokens'\?"):
        _notebook_config("embed", "/m", None, {"max_batch_token": 8})
    with pytest.raises(ConfigError, match=r"option 'dedup' \(scoring.dedup\) applies to the scoring job only"):
        _notebook_config("embed", "/m", None, {"dedup": "on"})
    with pytest.raises(ConfigError, match="scoring.max_batch_rows must be >= 1, got 0"):
        _notebook_config("embed", "/m", None, {"max_batch_rows": 0})
