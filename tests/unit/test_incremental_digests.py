"""The scoring spec incremental mode compares rows by: what changes the numbers (settings, the model's files besides
its weights, lakescore's output version), and nothing else."""

from __future__ import annotations

import dataclasses
import json

from lakescore.jobs.steps.context import ScoringSpec
from lakescore.schemas.output import OUTPUT_VERSION
from lakescore.udfs.models.model_source import ModelSpec, model_file_digests


def test_the_digest_follows_the_settings_that_change_the_numbers_only():
    spec = ModelSpec(task="classify", source="/models/sentiment")
    same = ScoringSpec.of(spec, {}).digest
    assert len(same) == 64 and ScoringSpec.of(spec, {}).digest == same
    # Where the files come from and where they run change no prediction: the files themselves are digested.
    for unchanged in (
        {"device": "cuda"},
        {"expect_sha256": "ab" * 32},
        {"source": "/elsewhere/sentiment"},
        {"revision": "main"},
        {"allow_pickle": True},
    ):
        assert ScoringSpec.of(dataclasses.replace(spec, **unchanged), {}).digest == same, unchanged
    for changed in (
        {"max_seq_length": 16},
        {"dtype": "bfloat16"},
        {"task": "embed"},
        {"pooling": "cls"},
        {"feature_cols": ("a", "b")},
        {"prompt_name": "query"},
        {"backend": "onnx"},
    ):
        assert ScoringSpec.of(dataclasses.replace(spec, **changed), {}).digest != same, changed


def test_every_generation_setting_is_in_the_digest():
    from lakescore.udfs.options.generate import GenerateOptions

    spec = ModelSpec(task="generate", source="/models/llm", generate=GenerateOptions())
    same = ScoringSpec.of(spec, {}).digest
    for changed in (
        {"max_new_tokens": 8},
        {"temperature": 0.7},
        {"top_p": 0.9},
        {"seed": 1},
        {"stop": ("\n",)},
        {"system_prompt": "Be brief."},
        {"chat_template": "never"},
        {"truncate": "left"},
        {"choices": ("yes", "no")},
        {"json_schema": '{"type": "object"}'},
        {"prompt_template": "{body}!"},
    ):
        options = GenerateOptions(**changed)
        assert ScoringSpec.of(dataclasses.replace(spec, generate=options), {}).digest != same, changed


def test_every_model_file_but_weights_and_documents_is_digested(tmp_path):
    (tmp_path / "1_Pooling").mkdir()
    files = {
        "config.json": "{}",
        "tokenizer.json": "{}",
        "vocab.txt": "a\nb",
        "1_Pooling/config.json": '{"mean": true}',
        "chat_template.jinja": "{{ x }}",
        "model.safetensors": "weights",
        "README.md": "# card",
        "LICENSE": "MIT",
        "onnx/model.onnx": "graph",
        ".cache/x.json": "{}",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    digests = model_file_digests(tmp_path)
    assert sorted(digests) == [
        "1_Pooling/config.json",
        "chat_template.jinja",
        "config.json",
        "tokenizer.json",
        "vocab.txt",
    ]
    assert model_file_digests(tmp_path / "model.safetensors") == {}  # a one-file model is all weights


def test_changes_name_the_part_that_differs(tmp_path):
    spec = ModelSpec(task="embed", source="/models/minilm")
    files = {"config.json": "a" * 64, "sentence_bert_config.json": "b" * 64}
    before = ScoringSpec.of(spec, files)
    assert before.changes_since(json.loads(json.dumps(before.parts))) is None  # as recorded in a commit's metadata
    edited = ScoringSpec.of(
        dataclasses.replace(spec, max_seq_length=8, normalize=False),
        {**files, "sentence_bert_config.json": "c" * 64, "modules.json": "d" * 64},
    )
    assert edited.changes_since(before.parts) == [
        "max_seq_length null -> 8",
        "normalize null -> false",
        "file modules.json added",
        "file sentence_bert_config.json changed",
    ]
    assert edited.digest != before.digest
    older = {**before.parts, "output_version": OUTPUT_VERSION - 1}
    assert before.changes_since(older) == [f"lakescore output version {OUTPUT_VERSION - 1} -> {OUTPUT_VERSION}"]
    assert before.changes_since(None) == [
        "the output's scoring spec was not recorded (written by an earlier lakescore)"
    ]
