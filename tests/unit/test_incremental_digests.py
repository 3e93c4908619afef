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
