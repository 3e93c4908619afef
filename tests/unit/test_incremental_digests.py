"""The scoring-spec digest incremental mode compares rows by: what changes the numbers, and nothing else."""

from __future__ import annotations

import dataclasses

from lakescore.jobs.steps.incremental import spec_digest
from lakescore.udfs.model_source import ModelSpec


def test_spec_digest_follows_what_changes_the_numbers_only():
    spec = ModelSpec(task="classify", source="/models/sentiment")
    same = spec_digest(spec)
    assert len(same) == 64 and spec_digest(spec) == same
    assert spec_digest(dataclasses.replace(spec, device="cuda", expect_sha256="ab" * 32)) == same
    for changed in ({"max_seq_length": 16}, {"dtype": "bfloat16"}, {"task": "embed"}, {"source": "/models/other"},
                    {"pooling": "cls"}, {"feature_cols": ("a", "b")}):
        assert spec_digest(dataclasses.replace(spec, **changed)) != same, changed


def test_a_spec_field_added_later_leaves_existing_outputs_digest_alone():
    """Digests an output written before ``prompt_name`` existed carries (pinned at e5a3e4e): an upgrade must not
    rescore every row. Setting the new field changes the digest, as any spec change does."""
    embed = ModelSpec("embed", "/models/minilm", max_seq_length=128, backend="onnx")
    assert spec_digest(embed) == "5c76b385dd4267b0d7438b5e834c0609e5c3a15b59e549d04b54424e02eb3ee0"
    assert spec_digest(ModelSpec("classify", "models:/reviews/3", revision="7")) == (
        "fe12357610bdbbb6a652c6488d5debcc0e312af2f11075a20ff9b0e9396fecd0"
    )
    assert spec_digest(dataclasses.replace(embed, prompt_name="passage")) != spec_digest(embed)
