"""Each task head against its peer, on real (tiny, seeded) models loaded through the real loaders."""

import json

import numpy as np
import pytest
import torch

from lakescore.udfs.batching import BatchPolicy, score_matrix, score_texts
from lakescore.udfs.models.model_fit import check_model_fits
from lakescore.udfs.models.model_source import ModelSourceError, ModelSpec, UnfitModelError
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
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=labels,
        problem_type=problem_type,
    )
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 1.0)  # scores away from 0, where the activations differ most
    model_dir = _save_with_minilm_tokenizer(model, tmp_path, minilm_dir)
    ours = _load("classify", model_dir).score(UNSEEN)
    peer = pipeline("text-classification", model=str(model_dir), top_k=None, device="cpu")
    expected = [
        [r["score"] for r in sorted(ranked, key=lambda r: config.label2id[r["label"]])] for ranked in peer(UNSEEN)
    ]
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
    from lakescore.udfs.models import model_cache
    from lakescore.udfs.models.quantize import QuantizationToleranceError, Tolerance
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
    assert refused["error"].startswith("bfloat16 model") and "Use model.dtype: float32" in refused["error"], refused[
        "error"
    ]
    assert exact["error"] is None and exact["fidelity"] is None  # float32 is the reference: nothing to check


def test_float16_on_a_cpu_runs_float32_and_is_not_checked(minilm_dir):
    """float16 has no CPU kernels, so a CPU worker runs it as float32 (devices.effective_dtype): nothing lossy ran."""
    from lakescore.udfs.models import model_cache
    from lakescore.udfs.models.quantize import Tolerance
    from tests.unit.test_backends import _preflight_row

    model_cache.clear()
    try:
        row = _preflight_row(
            ModelSpec("embed", str(minilm_dir), dtype="float16", device="auto"), ["a review"], Tolerance(min_cosine=1.0)
        )
    finally:
        model_cache.clear()
    assert row["error"] is None and row["fidelity"] is None and row["device"] == "cpu"


def _unfit(task, path, **options) -> str:
    """The one line the executors' load refuses ``path`` for ``task`` with."""
    with pytest.raises(UnfitModelError) as refused:
        _load(task, path, **options)
    return str(refused.value)


def _refused_on_the_driver(task, path) -> str:
    with pytest.raises(UnfitModelError) as refused:
        check_model_fits(ModelSpec(task, str(path)), path)
    return str(refused.value)


def test_a_classifier_checkpoint_is_no_language_model_for_generate(tiny_classifier_dir):
    """transformers would load it as a BertLMHeadModel with a random LM head: refused on the driver by its architecture,
    and on the executors by the head weights it lacks, each in one line naming the task and what does not fit."""
    line = _refused_on_the_driver("generate", tiny_classifier_dir)
    assert line.startswith("task generate: ") and "BertForSequenceClassification" in line and "…CausalLM" in line
    line = _unfit("generate", tiny_classifier_dir)
    assert line.startswith("task generate: ") and "loads as BertLMHeadModel without weights its output reads" in line
    assert "cls.predictions" in line and "\n" not in line


def test_the_python_api_refuses_that_checkpoint_before_any_spark_job(tiny_classifier_dir):
    """``pandas_udf`` / ``transform`` have no preflight: their own model check runs the driver's check of the job."""
    from lakescore import pandas_udf

    with pytest.raises(UnfitModelError) as refused:
        pandas_udf(task="generate", model=str(tiny_classifier_dir))
    assert str(refused.value).startswith("task generate: ") and "BertForSequenceClassification" in str(refused.value)


def test_a_base_model_has_no_token_classifier_for_ner(plain_bert_dir, tiny_ner_dir):
    assert "BertModel (config.json architectures), not a …ForTokenClassification" in _refused_on_the_driver(
        "ner", plain_bert_dir
    )
    line = _unfit("ner", plain_bert_dir)
    assert (
        line.startswith("task ner: ")
        and "BertForTokenClassification" in line
        and "classifier.bias, classifier.weight" in line
    )
    check_model_fits(ModelSpec("ner", str(tiny_ner_dir)), tiny_ner_dir)  # a token classifier fits
    _load("ner", tiny_ner_dir)


def test_an_embedding_checkpoint_without_a_pooler_still_embeds(minilm_dir, tmp_path):
    """The embed head pools the token embeddings itself: a sentence-transformers checkpoint saved without the base
    model's pooler loads (its pooler is not read), and embeds as the checkpoint with one does."""
    import shutil

    from safetensors.torch import load_file, save_file

    without = tmp_path / "minilm-without-pooler"
    shutil.copytree(minilm_dir, without)
    weights = load_file(str(without / "model.safetensors"))
    pooler = [k for k in weights if "pooler" in k]
    assert pooler  # the shipped checkpoint has one to drop
    save_file(
        {k: v for k, v in weights.items() if k not in pooler},
        str(without / "model.safetensors"),
        metadata={"format": "pt"},
    )
    check_model_fits(ModelSpec("embed", str(without)), without)
    texts = UNSEEN[:4]
    expected = _load("embed", minilm_dir).score(texts)
    np.testing.assert_allclose(_load("embed", without).score(texts), expected, atol=1e-6)


def test_the_drivers_architecture_names_are_transformers_own_auto_classes():
    """Every class transformers' auto class of a task builds fits the task by name on the driver (which imports no
    transformers), and no class of another head does (masked LMs and question answering included)."""
    from transformers.models.auto import modeling_auto as auto

    def names(*mappings):
        return {n for m in mappings for v in m.values() for n in ((v,) if isinstance(v, str) else v)}

    families = {
        "generate": names(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES),
        "classify": names(auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES),
        "ner": names(auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES),
        "image_classify": names(auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES),
        "masked_lm": names(auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES),
        "question_answering": names(auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES),
    }
    # Flaubert's masked LM is named as XLM's causal one (XLMWithLMHeadModel): the executors' load refuses it
    named_alike = {"FlaubertWithLMHeadModel"}
    for task in ("generate", "classify", "ner", "image_classify"):
        fits = lambda name: any(part in name for part in get_task(task).architectures)  # noqa: E731, B023 (this task's)
        assert sorted(n for n in families[task] if not fits(n)) == [], task
        others = {n for family, members in families.items() if family != task for n in members} - families[task]
        assert sorted(n for n in others - named_alike if fits(n)) == [], task
    assert not get_task("embed").architectures and not get_task("image_embed").architectures  # a base model of any


def test_a_preflight_refusal_is_the_workers_one_line_and_exit_2(tiny_classifier_dir):
    """The executors' preflight function reports the unfit model; the driver raises it as the worker worded it (not
    "failed to load or score a sample"), and the CLI exits 2 with that line."""
    from types import SimpleNamespace

    from lakescore.jobs.cli import EXIT_BAD_INPUT, _failure
    from lakescore.jobs.steps.preflight import raise_worker_failure
    from lakescore.udfs.scoring_udf import make_preflight_function

    spec = ModelSpec("generate", str(tiny_classifier_dir))
    batches = make_preflight_function(spec)(iter([]))
    rows = [SimpleNamespace(**row) for batch in batches for row in batch.to_pylist()]
    assert [r.error_type for r in rows] == ["UnfitModelError"]
    with pytest.raises(UnfitModelError) as refused:
        raise_worker_failure(spec, rows)
    assert str(refused.value) == rows[0].error
    assert _failure(refused.value) == (EXIT_BAD_INPUT, f"lakescore: error: {rows[0].error}")
