"""Every text head on model families other than BERT, against its reference library, on both backends.

The other unit tests run BERT shapes with MiniLM's WordPiece tokenizer. A user's model may be a RoBERTa, an
XLM-R or a decoder embedder (Qwen3-Embedding's layout), and what differs there can break a head: inputs without
``token_type_ids``; a pad id that is not 0 (RoBERTa counts its positions from it); left padding and last-token
pooling; the subword markers the NER aggregation reads (``Ġ`` for byte-level BPE, ``▁`` for Unigram); rotary
attention in the ONNX export. So each family gets a tokenizer of its own kind, trained here on a small corpus,
and a tiny seeded model built from its config; lakescore's heads must equal sentence-transformers and the
transformers pipelines on text none of them saw.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from lakescore.udfs.batching import BatchPolicy, score_texts
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.registry import get_task, named_columns
from tests.conftest import LABELS, NER_LABELS
from tests.unit.test_heads import UNSEEN
from tests.unit.test_ner import NER_UNSEEN, assert_same_entities

POLICY = BatchPolicy(max_tokens=256, max_rows=4)
"""Small batches: rows of different lengths share a padded batch, on either padding side."""

CORPUS = (
    UNSEEN
    + NER_UNSEEN[:-1]
    + [
        "The delivery was late but the blender works well and the support team answered quickly.",
        "Angela Merkel, Satya Nadella and Olaf Scholz met Microsoft and Siemens in Berlin, Redmond and Hamburg.",
        "Great value for money; I would recommend this kettle to friends and family without hesitation.",
    ]
)
"""The tokenizers' training text (the overlong NER row left out: it repeats one sentence sixty times)."""


@dataclass(frozen=True)
class Family:
    """A model family: its config class and settings, its tokenizer's kind and padding side."""

    config: str
    settings: dict
    tokenizer: str
    """``bpe`` (byte-level, RoBERTa / GPT-2 / Qwen) or ``unigram`` (sentencepiece-style, XLM-R / T5)."""
    padding_side: str = "right"
    pooling: str = "mean"
    """The embedding's sentence-transformers pooling (decoder embedders pool the last token)."""


SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
FAMILIES = {
    "roberta": Family("RobertaConfig", dict(SMALL, max_position_embeddings=130, type_vocab_size=1), "bpe"),
    "xlm-roberta": Family("XLMRobertaConfig", dict(SMALL, max_position_embeddings=130, type_vocab_size=1), "unigram"),
    "qwen3": Family(
        "Qwen3Config",
        dict(SMALL, num_key_value_heads=1, head_dim=16, max_position_embeddings=128),
        "bpe",
        "left",
        "lasttoken",
    ),
}
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
"""Special tokens in RoBERTa's order: ``<pad>`` is id 1, as in RoBERTa and XLM-R."""


def _tokenizer(family: Family):
    """A fast tokenizer of ``family``'s kind trained on :data:`CORPUS`: encoders wrap a row in ``<s> ... </s>``,
    decoders append ``</s>`` (as Qwen3-Embedding appends its end of text)."""
    from tokenizers import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    if family.tokenizer == "bpe":
        trained = ByteLevelBPETokenizer()
        trained.train_from_iterator(CORPUS, vocab_size=1000, special_tokens=SPECIALS)
    else:
        trained = SentencePieceUnigramTokenizer()
        trained.train_from_iterator(CORPUS, vocab_size=400, special_tokens=SPECIALS, unk_token="<unk>")
    single = "<s> $A </s>" if family.padding_side == "right" else "$A </s>"
    trained.post_processor = TemplateProcessing(single=single, special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=trained._tokenizer,
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        cls_token="<s>",
        sep_token="</s>",
        mask_token="<mask>",
        model_max_length=128,
        padding_side=family.padding_side,
    )
    tokenizer.model_input_names = ["input_ids", "attention_mask"]  # no token_type_ids, as these families' tokenizers
    return tokenizer


def _model(family: Family, task: str, vocab_size: int):
    """A seeded model of ``family`` for ``task``; a token classifier's head is made opinionated, as
    ``tiny_ner_dir``'s."""
    import transformers

    labels = {"classify": LABELS, "ner": NER_LABELS}.get(task, {})
    auto = {
        "embed": "AutoModel",
        "classify": "AutoModelForSequenceClassification",
        "ner": "AutoModelForTokenClassification",
    }
    config = getattr(transformers, family.config)(
        vocab_size=vocab_size,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **family.settings,
        **(dict(num_labels=len(labels), id2label=labels, label2id={v: k for k, v in labels.items()}) if labels else {}),
    )
    torch.manual_seed(0)
    model = getattr(transformers, auto[task]).from_config(config).eval()
    if task == "ner":
        head = model.classifier if hasattr(model, "classifier") else model.score
        with torch.no_grad():
            head.weight.normal_(0.0, 1.0)
            head.bias.zero_()
            head.bias[0] = -1.0
    return model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """``model_dir(family, task)``: the saved model of ``family`` for ``task``, built once per module."""
    built: dict[tuple[str, str], Path] = {}

    def build(name: str, task: str) -> Path:
        if (name, task) not in built:
            family = FAMILIES[name]
            path = tmp_path_factory.mktemp(f"{name}-{task}")
            tokenizer = _tokenizer(family)
            model = _model(family, task, len(tokenizer))
            if task == "embed":  # saved as sentence-transformers saves an embedder: its pooling in 1_Pooling
                _save_sentence_transformer(
                    model, tokenizer, family.pooling, tmp_path_factory.mktemp(f"{name}-hf"), path
                )
            else:
                model.save_pretrained(path)
                tokenizer.save_pretrained(path)
            built[name, task] = path
        return built[name, task]

    return build


def _save_sentence_transformer(model, tokenizer, pooling: str, hf_dir: Path, path: Path) -> None:
    """The Hugging Face save in ``hf_dir``, read back as sentence-transformers' Transformer module, then the
    embedder (Transformer, Pooling, Normalize) saved to ``path``."""
    from sentence_transformers import SentenceTransformer, models

    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    transformer = models.Transformer(str(hf_dir))
    pooled = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode=pooling)
    SentenceTransformer(modules=[transformer, pooled, models.Normalize()], device="cpu").save(str(path))


def _cases(onnx_family: str) -> list:
    """Every family on torch, and ``onnx_family`` on ONNX Runtime too: one export per family across the three tests
    (the body is what the export has to get right; a task only adds a linear head), ~10 s each."""
    return [(family, "torch") for family in FAMILIES] + [(onnx_family, "onnx")]


def _scored(task: str, path: Path, backend: str, cache: Path, texts: list[str]):
    head = get_task(task).load(ModelSpec(task, str(path), backend=backend, cache_dir=str(cache)), path)
    scored = score_texts(texts, head, POLICY)
    assert scored.ok.all(), [e for e in scored.errors if e]
    return head, scored


@pytest.mark.parametrize("family, backend", _cases("qwen3"))
def test_embed_equals_sentence_transformers(model_dir, onnx_cache_dir, family, backend):
    from sentence_transformers import SentenceTransformer

    path = model_dir(family, "embed")
    head, scored = _scored("embed", path, backend, onnx_cache_dir, UNSEEN)
    assert head.pooling == (FAMILIES[family].pooling,) and head.padding_side == FAMILIES[family].padding_side
    peer = SentenceTransformer(str(path), device="cpu").encode(UNSEEN, batch_size=len(UNSEEN))
    np.testing.assert_allclose(scored.outputs, peer, atol=1e-5)


@pytest.mark.parametrize("family, backend", _cases("xlm-roberta"))
def test_classify_equals_the_transformers_pipeline(model_dir, onnx_cache_dir, family, backend):
    from transformers import pipeline

    path = model_dir(family, "classify")
    head, scored = _scored("classify", path, backend, onnx_cache_dir, UNSEEN)
    columns = named_columns("classify", head.columns(scored.outputs, scored.ok))
    peer = pipeline("text-classification", model=str(path), top_k=None, device="cpu")
    for i, ranked in enumerate(peer(UNSEEN, truncation=True)):  # as lakescore, at the tokenizer's 128
        expected = {r["label"]: r["score"] for r in ranked}
        assert columns["label"][i].as_py() == ranked[0]["label"], UNSEEN[i]
        np.testing.assert_allclose(columns["probs"][i].as_py(), [expected[label] for label in head.labels], atol=1e-4)


@pytest.mark.parametrize("family, backend", _cases("roberta"))
def test_ner_equals_the_pipeline(model_dir, onnx_cache_dir, family, backend):
    from transformers import pipeline

    path = model_dir(family, "ner")
    _, scored = _scored("ner", path, backend, onnx_cache_dir, NER_UNSEEN)
    peer = pipeline("token-classification", model=str(path), aggregation_strategy="simple", device="cpu")
    for text, entities in zip(NER_UNSEEN, scored.outputs):
        assert_same_entities(entities, peer(text), text)
    assert sum(len(e) for e in scored.outputs) >= 50  # a comparison with entities to compare
