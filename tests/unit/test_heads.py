"""Each task head against its peer, on real (tiny, seeded) models loaded through the real loaders."""

import json

import numpy as np
import pytest
import torch

from lakescore.udfs.batching import BatchPolicy, score_matrix, score_texts
from lakescore.udfs.model_source import ModelSourceError, ModelSpec
from lakescore.udfs.registry import get_task, named_columns

UNSEEN = [
    "The blender died after two weeks; support never answered.",
    "ok",
    "Absolutely love it, would buy again!!! " * 20,
    "Das Produkt ist gut, aber die Lieferung war langsam.",
    "配送が早くて助かりました",
    "",
    "SELECT * FROM reviews; -- not an attack, just a review",
]


def _load(task, path, **options):
    return get_task(task).load(ModelSpec(task, str(path), **options), path)


def test_classify_equals_the_transformers_pipeline(tiny_classifier_dir):
    from transformers import pipeline

    head = _load("classify", tiny_classifier_dir)
    scored = score_texts(UNSEEN, head, BatchPolicy(max_tokens=256, max_rows=4))
    columns = named_columns("classify", head.columns(scored.outputs, scored.ok))
    peer = pipeline("text-classification", model=str(tiny_classifier_dir), top_k=None, device="cpu")
    for i, text in enumerate(UNSEEN):
        ranked = peer(text)
        if ranked and isinstance(ranked[0], list):  # some versions wrap a single input's ranking in a list
            ranked = ranked[0]
        expected = {r["label"]: r["score"] for r in ranked}
        probs = columns["probs"][i].as_py()
        assert columns["label"][i].as_py() == ranked[0]["label"]
        assert abs(columns["score"][i].as_py() - ranked[0]["score"]) < 1e-4
        assert np.allclose(probs, [expected[label] for label in head.labels], atol=1e-4)
        assert abs(sum(probs) - 1) < 1e-6


@pytest.mark.parametrize("problem_type, labels", [("regression", 1), ("multi_label_classification", 3), (None, 1)])
def test_classify_applies_the_pipelines_activation(tmp_path, minilm_dir, problem_type, labels):
    """A regression model's score is its logit (no sigmoid); multi-label and one-label models' are sigmoids."""
    from transformers import BertConfig, BertForSequenceClassification, pipeline

    from tests.conftest import _save_with_minilm_tokenizer

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=labels, problem_type=problem_type)
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 1.0)  # scores away from 0, where the activations differ most
    model_dir = _save_with_minilm_tokenizer(model, tmp_path, minilm_dir)
    ours = _load("classify", model_dir).score(UNSEEN)
    peer = pipeline("text-classification", model=str(model_dir), top_k=None, device="cpu")
    expected = [[r["score"] for r in sorted(ranked, key=lambda r: config.label2id[r["label"]])] for ranked in peer(UNSEEN)]
    np.testing.assert_allclose(ours, expected, atol=1e-5)


def test_classify_truncates_texts_longer_than_the_model(tiny_classifier_dir):
    head = _load("classify", tiny_classifier_dir, max_seq_length=16)
    scored = score_texts(["word " * 5000], head, BatchPolicy(max_tokens=256, max_rows=4))
    assert scored.ok.all() and scored.outputs.shape == (1, 3)


def test_pickle_weights_are_refused_unless_allowed(tmp_path, tiny_classifier_dir):
    import shutil

    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_classifier_dir))
    target = tmp_path / "pickled"
    target.mkdir()
    model.config.save_pretrained(target)
    torch.save(model.state_dict(), target / "pytorch_model.bin")  # a pickle checkpoint, as older tooling writes
    for f in tiny_classifier_dir.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special")):
            shutil.copy(f, target / f.name)
    assert (target / "pytorch_model.bin").exists() and not (target / "model.safetensors").exists()
    with pytest.raises(ModelSourceError, match="pickle-based weights.*allow_pickle"):
        _load("classify", target)
    head = _load("classify", target, allow_pickle=True)
    safe = _load("classify", tiny_classifier_dir)
    assert np.allclose(head.score(UNSEEN[:3]), safe.score(UNSEEN[:3]), atol=1e-6)


@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_tabular_program_equals_the_module(tiny_tabular, fmt):
    from tests.conftest import TinyTabular

    module, script, exported = tiny_tabular
    path = script if fmt == "torchscript" else exported.parent  # a file, or a directory holding one program
    head = _load("tabular", path, feature_cols=TinyTabular.FEATURES)
    matrix = np.random.default_rng(3).normal(size=(37, 4))
    scored = score_matrix(matrix, head, BatchPolicy(max_tokens=1024, max_rows=8))
    with torch.no_grad():
        peer = module(torch.as_tensor(matrix, dtype=torch.float32)).double().numpy()
    assert np.allclose(scored.outputs, peer, atol=1e-6)
    columns = named_columns("tabular", head.columns(scored.outputs, scored.ok))
    assert columns["prediction"].to_pylist() == peer.argmax(1).astype(float).tolist()


def test_tabular_regression_prediction_is_the_value(tmp_path):
    torch.manual_seed(1)
    module = torch.nn.Linear(3, 1).eval()
    path = tmp_path / "reg.pt"
    torch.jit.save(torch.jit.script(module), str(path))
    head = _load("tabular", path, feature_cols=("a", "b", "c"))
    matrix = np.arange(6, dtype=float).reshape(2, 3)
    columns = named_columns("tabular", head.columns(head.forward(matrix), np.array([True, True])))
    with torch.no_grad():
        expected = module(torch.as_tensor(matrix, dtype=torch.float32)).squeeze(1).tolist()
    assert np.allclose(columns["prediction"].to_pylist(), expected, atol=1e-6)


def test_tabular_directory_needs_exactly_one_program(tmp_path):
    (tmp_path / "a.pt").write_bytes(b"x")
    (tmp_path / "b.pt2").write_bytes(b"y")
    with pytest.raises(ModelSourceError, match="exactly one"):
        _load("tabular", tmp_path, feature_cols=("a",))


BF16_COSINE = 0.995
"""Documented tolerance: bfloat16 embeddings keep cosine >= 0.995 to float32 (measured min here ~0.999)."""


def test_bfloat16_embeddings_stay_within_the_documented_tolerance(minilm_dir):
    fp32 = _load("embed", minilm_dir)
    bf16 = _load("embed", minilm_dir, dtype="bfloat16")
    texts = [t for t in UNSEEN if t] * 2
    a = score_texts(texts, fp32, BatchPolicy(1024, 16)).outputs
    b = score_texts(texts, bf16, BatchPolicy(1024, 16)).outputs
    assert b.dtype == np.float32  # outputs are float32 whatever the compute precision
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() >= BF16_COSINE


def test_bfloat16_classifier_probabilities_stay_within_tolerance(tiny_classifier_dir):
    fp32 = _load("classify", tiny_classifier_dir).score(UNSEEN)
    bf16 = _load("classify", tiny_classifier_dir, dtype="bfloat16").score(UNSEEN)
    assert np.abs(fp32 - bf16).max() < 0.02  # documented: bf16 probabilities within 0.02 of fp32


def test_a_bfloat16_run_is_checked_against_float32_before_it_scores(minilm_dir):
    """bfloat16 is lossy, so the preflight scores the run's sample both ways, as for int8: within tolerance it
    reports the figures; outside it refuses, naming the dtype and the setting that turns it off."""
    from lakescore.udfs import model_cache
    from lakescore.udfs.quantize import QuantizationToleranceError, Tolerance
    from tests.unit.test_backends import _preflight_row

    sample = [t for t in UNSEEN if t] * 3
    bf16 = ModelSpec("embed", str(minilm_dir), dtype="bfloat16")
    assert (bf16.reduced_precision, ModelSpec("embed", str(minilm_dir)).reduced_precision) == ("bfloat16", None)
    model_cache.clear()
    try:
        passed = _preflight_row(bf16, sample, Tolerance())
        refused = _preflight_row(bf16, sample, Tolerance(min_cosine=0.9999999))
        exact = _preflight_row(ModelSpec("embed", str(minilm_dir)), sample, Tolerance(min_cosine=1.0))
    finally:
        model_cache.clear()
    figures = json.loads(passed["fidelity"])
    assert passed["error"] is None and BF16_COSINE <= figures["cosine_p1"] < 1.0, figures
    assert refused["error_type"] == QuantizationToleranceError.__name__
    assert refused["error"].startswith("bfloat16 model") and "Use model.dtype: float32" in refused["error"], refused["error"]
    assert exact["error"] is None and exact["fidelity"] is None  # float32 is the reference: nothing to check


def test_float16_on_a_cpu_runs_float32_and_is_not_checked(minilm_dir):
    """float16 has no CPU kernels, so a CPU worker runs it as float32 (devices.effective_dtype): nothing lossy ran."""
    from lakescore.udfs import model_cache
    from lakescore.udfs.quantize import Tolerance
    from tests.unit.test_backends import _preflight_row

    model_cache.clear()
    try:
        row = _preflight_row(ModelSpec("embed", str(minilm_dir), dtype="float16", device="auto"), ["a review"], Tolerance(min_cosine=1.0))
    finally:
        model_cache.clear()
    assert row["error"] is None and row["fidelity"] is None and row["device"] == "cpu"
