from pathlib import Path

import pytest
import yaml

from lakescore.jobs.config import ConfigError, config_from_mapping, load_config


def write(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_defaults_without_file():
    cfg = load_config()
    assert cfg.task == "embed"
    assert cfg.spark.master == "local[*]"
    assert cfg.scoring.max_batch_rows == 256
    assert cfg.scoring.max_tokens_for("cpu") == 1024 and cfg.scoring.max_tokens_for("cuda:1") == 65536
    assert cfg.validation.enabled is True


def test_file_then_set_then_flags(tmp_path):
    path = write(
        tmp_path,
        "input: db.raw\nid_col: id\nscoring:\n  max_batch_rows: 8\nspark:\n  conf:\n    spark.sql.shuffle.partitions: "
        "4\n",
    )
    cfg = load_config(path, ["scoring.max_batch_rows=16", "input=db.other"], {"input": "db.flag", "text_col": None})
    assert cfg.input == "db.flag"  # flag beats --set beats file
    assert cfg.scoring.max_batch_rows == 16
    assert cfg.id_col == "id"
    assert cfg.text_col is None  # a None flag means "not given"
    assert cfg.spark.conf == {"spark.sql.shuffle.partitions": "4"}  # Spark confs become strings


def test_a_model_given_as_one_string_is_its_source(tmp_path):
    # YAML, then a flag below it; the Python API's mapping (lakescore.score(model=...)), a path too; --set.
    cfg = load_config(write(tmp_path, "model: /models/minilm\n"), ["model.revision=v2"], {"model.device": "auto"})
    assert (cfg.model.source, cfg.model.revision, cfg.model.device) == ("/models/minilm", "v2", "auto")
    assert config_from_mapping({"model": Path("/models/minilm")}).model.source == "/models/minilm"
    assert load_config(overrides=["model=hub/name"]).model.source == "hub/name"
    assert config_from_mapping({"model": {"source": "/m", "dtype": "bfloat16"}}).model.dtype == "bfloat16"
    with pytest.raises(ConfigError, match="model must be a mapping, got int"):
        config_from_mapping({"model": 3})


def test_set_spark_conf_keeps_the_dotted_spark_key_whole():
    cfg = load_config(
        overrides=[
            "spark.conf.spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000",
            "spark.conf.spark.hadoop.fs.s3a.path.style.access=true",
        ]
    )
    assert cfg.spark.conf == {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.path.style.access": "true",
    }


def test_nested_spark_conf_value_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"spark.conf.spark must be a single value"):
        load_config(write(tmp_path, "spark:\n  conf:\n    spark:\n      ui: {enabled: false}\n"))


@pytest.mark.parametrize("raw, expected", [("true", True), ("false", False), ("null", None)])
def test_spark_s3a_is_a_tri_state(raw, expected):
    assert load_config(overrides=[f"spark.s3a={raw}"]).spark.s3a is expected


def test_unknown_key_names_it_and_suggests(tmp_path):
    with pytest.raises(
        ConfigError, match=r"unknown config key 'scoring.max_batch_tokenz'; did you mean 'scoring.max_batch_tokens'"
    ):
        load_config(write(tmp_path, "scoring:\n  max_batch_tokenz: 3\n"))


def test_unknown_top_level_key_from_set():
    with pytest.raises(ConfigError, match=r"unknown config key 'modle'; did you mean 'model'"):
        load_config(overrides=["modle.source=x"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("scoring.max_batch_rows=many", r"scoring.max_batch_rows must be an integer, got 'many'"),
        ("scoring.max_batch_tokens=0", r"scoring.max_batch_tokens must be >= 1, got 0"),
        ("validation.enabled=maybe", r"validation.enabled must be true or false"),
        (
            "task=summarize",
            r"task must be one of classify, embed, ner, image_classify, image_embed, tabular, generate, transcribe, "
            r"got 'summarize'",
        ),
        ("model.device=tpu", r"model.device must be one of auto, cpu, cuda, got 'tpu'"),
        ("model.dtype=int8", r"model.dtype must be one of float32, bfloat16, float16"),
        ("model.dtype=float16", r"float16 needs a GPU"),
        ("model.expect_sha256=abc", r"model.expect_sha256 must be 64 hex digits"),
        ("max_error_rate=2", r"max_error_rate must be between 0 and 1, got 2.0"),
        ("max_error_rate=lots", r"max_error_rate must be a number"),
        ("run_date=2026-13-01", r"run_date must be YYYY-MM-DD"),
        ("write.mode=append", r"write.mode must be one of overwrite, replace_run, incremental"),
        ("scoring.dedup=sometimes", r"scoring.dedup must be one of auto, on, off, got 'sometimes'"),
        ("write.delete_missing=true", r"write.delete_missing applies to write.mode incremental only, not 'overwrite'"),
        ("validation.value_ranges.score=[1, 0]", r"validation.value_ranges.score must be \[min, max\]"),
        ("validation.max_null_fraction.label=1.5", r"validation.max_null_fraction.label must be between 0 and 1"),
        (
            "model.pooling=median",
            r"model.pooling must be one of cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken, got 'median'",
        ),
        ("model.prompt_name=", r"--set model.prompt_name= gives no value"),  # the schema refuses "" from a file too
        ("spark.log_level=LOUD", r"spark.log_level must be one of"),
        ("scoring=3", r"scoring must be a mapping"),
        ("spark.s3a=auto", r"spark.s3a must be true or false"),
        ("batch_size", r"--set expects dotted.key=value"),
    ],
)
def test_bad_values_fail_with_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


@pytest.mark.parametrize("option", ["model.prompt_name=passage", "model.normalize=false", "model.pooling=cls"])
def test_an_embedding_setting_on_another_task_is_refused(option):
    with pytest.raises(ConfigError, match=r"model\.\w+ applies to task embed, not 'classify'"):
        load_config(overrides=["task=classify", option])
    assert load_config(overrides=["task=embed", option]).task == "embed"


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "input: [unclosed\n"))
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_a_key_given_twice_in_the_file_is_refused_naming_it_and_both_lines(tmp_path):
    # PyYAML keeps the last copy silently: a pasted line would change the run (issue 65).
    path = write(tmp_path, "task: embed\nembed:\n  chunk:\n    max_tokens: 64\n    overlap: 8\n    max_tokens: 32\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"config file {path} gives key 'max_tokens' twice (lines 4 and 6): keep one"
    with pytest.raises(ConfigError, match=r"gives key 'task' twice \(lines 1 and 3\)"):
        load_config(write(tmp_path, "task: embed\ninput: db.t\ntask: classify\n"))
    # The same key in two sections is no duplicate, nor is a merged key (`<<`) given again, as YAML intends.
    cfg = load_config(write(tmp_path, "task: embed\nembed: {chunk: {max_tokens: 9}}\nmodel: {max_seq_length: 9}\n"))
    assert (cfg.embed.chunk.max_tokens, cfg.model.max_seq_length) == (9, 9)
    from lakescore.jobs.config.loading import _UniqueKeyLoader

    merged = yaml.load("a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  x: 3\n", Loader=_UniqueKeyLoader)
    assert merged["b"] == {"x": 3, "y": 2}


@pytest.mark.parametrize(
    "key",
    [
        "embed.chunk.max_tokens",
        "embed.chunk.max_chunks",
        "generate.system_prompt",
        "task",
        "generate.max_new_tokens",
        "model.source",
    ],
)
def test_an_empty_set_value_is_refused_for_every_key(key, tmp_path):
    # An unset shell variable (--set embed.chunk.max_tokens=$CHUNK) must not switch chunking off (issue 65).
    for empty in ("", "  "):
        with pytest.raises(ConfigError) as err:
            load_config(overrides=[f"{key}={empty}"])
        assert str(err.value) == (
            f"--set {key}= gives no value (an unset variable?): give one, or leave the --set out for the default"
        )
    with pytest.raises(
        ConfigError, match=r"^model.prompt_name must name one of the model's prompts, got an empty string"
    ):
        load_config(write(tmp_path, "model: {prompt_name: ''}\n"))


def test_require_for_scoring_lists_every_missing_setting():
    cfg = load_config(flags={"input": "db.t"})
    with pytest.raises(ConfigError) as err:
        cfg.require_for_scoring()
    message = str(err.value)
    for name in ("output", "model.source", "id_col", "text_col"):
        assert name in message
    assert "input," not in message


def test_same_id_and_text_column_is_refused():
    cfg = load_config(flags={"input": "a", "output": "b", "model.source": "m", "id_col": "x", "text_col": "x"})
    with pytest.raises(ConfigError, match="id_col and text_col must differ"):
        cfg.require_for_scoring()


def test_tabular_needs_features_not_text():
    base = {"input": "a", "output": "b", "model.source": "m", "id_col": "id", "task": "tabular"}
    with pytest.raises(ConfigError, match="feature_cols .* or feature_prefix"):
        load_config(flags=base).require_for_scoring()
    cfg = load_config(flags={**base, "feature_cols": "f1, f2,f3"})
    cfg.require_for_scoring()
    assert cfg.feature_cols == ("f1", "f2", "f3")
    with pytest.raises(ConfigError, match="text_col is for text tasks"):
        load_config(flags={**base, "feature_prefix": "f", "text_col": "t"}).require_for_scoring()


def test_run_id_comes_from_run_date_and_errors_default_beside_output():
    cfg = load_config(flags={"output": "db.scores", "run_date": "2026-11-20"})
    assert cfg.resolved_run_id() == "2026-11-20" and cfg.errors_ref() == "db.scores_errors"
    assert load_config(flags={"run_date": "2026-11-20", "run_id": "nightly-7"}).resolved_run_id() == "nightly-7"
    assert load_config(flags={"output": "/data/scores/"}).errors_ref() == "/data/scores_errors"


def test_user_expectations_parse():
    cfg = load_config(
        overrides=[
            "validation.value_ranges.score=[0, 1]",
            "validation.max_null_fraction.label=0.1",
            "validation.min_rows=5",
        ]
    )
    assert cfg.validation.value_ranges == {"score": (0.0, 1.0)} and cfg.validation.max_null_fraction == {"label": 0.1}
    assert cfg.validation.min_rows == 5


def test_shipped_conf_files_load():
    from pathlib import Path

    conf_dir = Path(__file__).resolve().parents[2] / "conf"
    files = sorted(conf_dir.glob("*.yaml"))
    assert files, "conf/ holds no YAML"
    for path in files:
        load_config(path)


def test_incremental_mode_refuses_min_rows_and_takes_delete_missing():
    with pytest.raises(ConfigError, match=r"validation.min_rows counts the rows a run publishes.*incremental"):
        load_config(overrides=["write.mode=incremental", "validation.min_rows=10"])
    cfg = load_config(overrides=["write.mode=incremental", "write.delete_missing=true"])
    assert (cfg.write.mode, cfg.write.delete_missing) == ("incremental", True)
    assert load_config().write.delete_missing is False


def test_dedup_on_and_off_survive_yaml_reading_them_as_booleans(tmp_path):
    assert load_config(overrides=["scoring.dedup=on"]).scoring.dedup == "on"
    assert load_config(write(tmp_path, "scoring:\n  dedup: off\n")).scoring.dedup == "off"
    assert load_config().scoring.dedup == "auto"
    with pytest.raises(ConfigError, match="validation.enabled must be true or false"):
        load_config(overrides=["validation.enabled=auto"])


def test_image_tasks_read_image_col_and_a_folder_needs_no_columns():
    base = {"input": "a", "output": "b", "model.source": "m", "task": "image_classify"}
    with pytest.raises(
        ConfigError, match=r"missing required setting\(s\): id_col \(--id-col\), image_col \(--image-col\)$"
    ):
        load_config(flags=base).require_for_scoring()
    cfg = load_config(flags={**base, "id_col": "id", "image_col": "photo"})
    cfg.require_for_scoring()
    assert (cfg.column_setting, cfg.input_col) == ("image_col", "photo")
    with pytest.raises(
        ConfigError,
        match=r"^text_col is for text tasks \(classify, embed, ner, generate\); task 'image_classify' reads image_col$",
    ):
        load_config(flags={**base, "id_col": "id", "image_col": "photo", "text_col": "t"}).require_for_scoring()
    with pytest.raises(
        ConfigError,
        match=r"^image_col is for image tasks \(image_classify, image_embed\); task 'embed' reads text_col$",
    ):
        load_config(
            flags={**base, "task": "embed", "id_col": "id", "text_col": "t", "image_col": "photo"}
        ).require_for_scoring()
    with pytest.raises(ConfigError, match="id_col and image_col must differ"):
        load_config(flags={**base, "id_col": "x", "image_col": "x"}).require_for_scoring()
    # A folder of image files: Spark's binaryFile columns, the path the id and the bytes the image
    folder = load_config(flags={**base, "input_format": "images"})
    folder.require_for_scoring()
    assert (folder.id_col, folder.image_col) == ("path", "content")
    assert (
        load_config(flags={**base, "input_format": "images", "id_col": "path", "image_col": "content"}).id_col == "path"
    )
    assert load_config(flags={**base, "scoring.max_image_pixels": 10**6}).scoring.max_image_pixels == 10**6
    with pytest.raises(
        ConfigError, match=r"^scoring.max_image_pixels applies to task image_classify, image_embed, not 'embed'$"
    ):
        load_config(flags={**base, "task": "embed", "scoring.max_image_pixels": 10**6})
    with pytest.raises(
        ConfigError, match=r"^input_format images is for task image_classify, image_embed, not 'embed'$"
    ):
        load_config(flags={**base, "task": "embed", "input_format": "images"})


def test_lossy_precision_is_refused_where_no_tolerance_check_runs():
    for task, extra in (("image_classify", {}), ("tabular", {"feature_cols": ["a"]})):
        with pytest.raises(ConfigError, match=f"bfloat16 is checked against float32 .* task '{task}' runs float32"):
            config_from_mapping({"task": task, "model": {"dtype": "bfloat16"}, **extra})
    assert config_from_mapping({"task": "generate", "model": {"dtype": "bfloat16"}}).model.dtype == "bfloat16"


def test_an_id_is_one_column_or_a_list_from_yaml_set_flags_and_the_cli(tmp_path):
    from lakescore.jobs.cli import _config_flags, _parser

    one = load_config(flags={"id_col": "review_id"})
    assert (one.id_col, one.id_cols) == ("review_id", ("review_id",))  # one column stays a string
    assert load_config(write(tmp_path, "id_col: [user_id, item_id]\n")).id_cols == ("user_id", "item_id")
    assert load_config(overrides=["id_col=[user_id, item_id]"]).id_cols == ("user_id", "item_id")
    assert config_from_mapping({"id_col": ["user_id", "item_id"]}).id_cols == ("user_id", "item_id")  # lakescore.score
    assert load_config(flags={"id_col": ["only"]}).id_col == "only"
    args = _parser().parse_args(["score", "--id-col", "user_id, item_id"])
    assert load_config(flags=_config_flags(args)).id_cols == ("user_id", "item_id")
    assert load_config().id_cols == ()
    with pytest.raises(ConfigError, match=r"^id_col names 'user_id' twice$"):
        load_config(flags={"id_col": ["user_id", "item_id", "user_id"]})
    with pytest.raises(ConfigError, match=r"^id_col must name at least one column$"):
        load_config(overrides=["id_col=[]"])
    base = {"input": "a", "output": "b", "model.source": "m", "text_col": "body"}
    with pytest.raises(ConfigError, match="id_col and text_col must differ, both are 'body'"):
        load_config(flags={**base, "id_col": "user_id,body"}).require_for_scoring()


def test_rank_needs_its_keys_and_an_output_column_of_single_values():
    cfg = load_config(
        flags={
            "task": "tabular",
            "id_col": "user_id,item_id",
            "rank": {"partition_by": ["shop", "user_id"], "order_by": "prediction", "top_k": 3},
        }
    )
    assert (cfg.rank.enabled, cfg.rank.descending, cfg.row_cols) == (True, True, ("user_id", "item_id", "shop"))
    assert not load_config().rank.enabled and load_config(flags={"id_col": "a"}).row_cols == ("a",)
    with pytest.raises(ConfigError, match=r"^rank needs rank.partition_by, rank.order_by too \(given: top_k\)$"):
        load_config(overrides=["rank.top_k=3"])
    with pytest.raises(ConfigError, match=r"rank.top_k must be >= 1, got 0"):
        load_config(overrides=["rank.top_k=0", "rank.order_by=score", "rank.partition_by=[u]", "task=classify"])
    with pytest.raises(
        ConfigError, match=r"rank.order_by must be one of task 'classify''s output columns \(label, score, probs\)"
    ):
        load_config(overrides=["rank.top_k=3", "rank.order_by=prediction", "rank.partition_by=[u]", "task=classify"])
    with pytest.raises(ConfigError, match=r"rank.order_by 'scores' holds array<double>"):
        load_config(overrides=["rank.top_k=3", "rank.order_by=scores", "rank.partition_by=[u]", "task=tabular"])


def test_set_hands_a_string_key_its_text_as_typed_and_reads_other_keys_as_yaml():
    # Read as YAML, "Review: {body}" was a mapping and the config refused it; a string key takes the text as it is,
    # a backslash-n included (two characters: the shell's quoting decides what the text holds).
    cfg = load_config(
        overrides=[
            "model=/models/x: y",
            "task=generate",
            "generate.prompt_template=Review: {body}",
            "generate.system_prompt=yes",
            "model.revision=2",
            "run_date=2026-11-20",
            "generate.max_new_tokens=5",
            "generate.temperature=0.5",
            'generate.stop=["\\n", "."]',
            "scoring.dedup=off",
            "spark.conf.spark.executor.cores=4",
        ]
    )
    assert cfg.generate.prompt_template == "Review: {body}" and cfg.generate.system_prompt == "yes"
    assert load_config(
        overrides=["task=generate", "generate.prompt_template=Review: {body}\\nSummary:"]
    ).generate.prompt_template == ("Review: {body}" + "\\" + "nSummary:")
    assert (cfg.model.revision, cfg.run_date, cfg.model.source) == ("2", "2026-11-20", "/models/x: y")
    assert (cfg.generate.max_new_tokens, cfg.generate.temperature, cfg.generate.stop) == (5, 0.5, ("\n", "."))
    assert cfg.scoring.dedup == "off" and cfg.spark.conf == {"spark.executor.cores": "4"}
    assert load_config(overrides=["model.prompt_name=query: {x}"]).model.prompt_name == "query: {x}"
    with pytest.raises(ConfigError, match=r"^generate.max_new_tokens must be an integer, got 'many'$"):
        load_config(overrides=["generate.max_new_tokens=many"])


def test_the_common_generate_settings_have_flags_from_the_schema():
    from lakescore.jobs.cli import _config_flags, _parser
    from lakescore.jobs.config import config_options

    flags = {o.key: o.flag for o in config_options() if o.section == "generate" and o.flag}
    assert set(flags.values()) >= {
        "--prompt-template",
        "--system-prompt",
        "--max-new-tokens",
        "--temperature",
        "--top-p",
        "--seed",
        "--stop",
    }
    args = _parser().parse_args(
        [
            "score",
            "--task",
            "generate",
            "--prompt-template",
            "Review: {body}\nSummary:",
            "--system-prompt",
            "Be brief.",
            "--max-new-tokens",
            "12",
            "--temperature",
            "0.7",
            "--top-p",
            "0.9",
            "--seed",
            "3",
            "--stop",
            ", ",
            "--stop",
            "\n\n",
        ]
    )
    generate = load_config(flags=_config_flags(args)).generate
    assert (generate.prompt_template, generate.system_prompt) == ("Review: {body}\nSummary:", "Be brief.")
    assert (generate.max_new_tokens, generate.temperature, generate.top_p, generate.seed) == (12, 0.7, 0.9, 3)
    assert generate.stop == (", ", "\n\n")  # one stop string per flag: a comma stays in it
    assert load_config(flags=_config_flags(_parser().parse_args(["score"]))).generate == load_config().generate


def _readme_block(holding: str, fence: str) -> str:
    """The ``fence`` code block of README.md that holds the text ``holding``."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    at = text.index(holding)
    start = text.rindex(f"```{fence}\n", 0, at) + len(fence) + 4
    return text[start : text.index("```", at)]


def test_the_readme_generate_commands_give_the_model_what_they_show(tmp_path):
    """The README's generate commands, run by bash as a reader pastes them (its quoting decides the text), through
    the real CLI parser: the labels prompt holds a newline where the README shows ``\\n``, and the JSON schema loads."""
    import subprocess

    from lakescore.jobs.cli import _config_flags, _parser
    from lakescore.udfs.options.generate import template_parts

    (tmp_path / "summaries.yaml").write_text(_readme_block("# summaries.yaml", "yaml"), encoding="utf-8")
    commands = _readme_block("# Labels:", "bash")
    shell = "lakescore() { printf '%s\\0' \"$@\"; printf '\\1'; }\n" + commands  # each command's argv, NUL-separated
    out = subprocess.run(["bash", "-c", shell], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    configs = []
    for argv in [c.split("\0")[:-1] for c in out.split("\1")[:-1]]:
        args = _parser().parse_args(argv)
        configs.append(load_config(tmp_path / args.conf, args.overrides, _config_flags(args)))
    labels, fields = configs
    rendered = "".join(
        literal + ({"body": "Arrived late."}[name] if name else "")
        for literal, name in template_parts(labels.generate.prompt_template)
    )
    assert rendered == "Review: Arrived late.\nSentiment:" and labels.generate.choices == (
        "positive",
        "negative",
        "mixed",
    )
    assert fields.generate.max_new_tokens == 96 and '"delivery_days"' in fields.generate.json_schema


def test_the_readme_image_prompt_commands_load_as_they_show(tmp_path):
    """The README's images-with-prompts commands, run by bash as pasted, through the real CLI parser: both read images
    with a prompt (a binary column, a folder), and the receipts' JSON schema loads."""
    import json
    import subprocess

    from lakescore.jobs.cli import _config_flags, _parser

    commands = _readme_block("# captions for every product photo", "bash")
    shell = "lakescore() { printf '%s\\0' \"$@\"; printf '\\1'; }\n" + commands
    out = subprocess.run(["bash", "-c", shell], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    captions, receipts = [
        load_config(None, (args := _parser().parse_args(argv)).overrides, _config_flags(args))
        for argv in [c.split("\0")[:-1] for c in out.split("\1")[:-1]]
    ]
    for cfg in (captions, receipts):
        cfg.require_for_scoring()
        assert cfg.input_kind.prompted and cfg.prompt_template
    assert (captions.image_col, receipts.image_col) == ("photo", "content")
    assert json.loads(receipts.generate.json_schema)["required"] == ["merchant", "total"]
    guide = (Path(__file__).resolve().parents[2] / "docs" / "generation.md").read_text(encoding="utf-8")
    for name in ("captions", "receipts"):
        at = guide.index(f"# conf/{name}.yaml")
        (tmp_path / f"{name}.yaml").write_text(guide[at : guide.index("```", at)], encoding="utf-8")
        cfg = load_config(tmp_path / f"{name}.yaml")
        cfg.require_for_scoring()
        assert cfg.input_kind.prompted
