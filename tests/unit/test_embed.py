"""The embed head against its peer, sentence-transformers, on real and on freshly built models."""

import numpy as np
import pytest
import torch

from lakescore.udfs.heads.embed import load_embedder
from lakescore.udfs.models.model_source import ModelSourceError, ModelSpec

TEXTS = [
    "The kettle boils fast and the lid closes firmly.",
    "",
    "Ünïcödé, 日本語のレビュー, عربي, and emoji 🙂🔥 in one review.",
    "word " * 1500,  # far past max_seq_length: must be truncated the way the peer truncates
    "short",
]


def cosine(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_minilm_matches_sentence_transformers(minilm_dir, sentence_transformer):
    embedder = load_embedder(ModelSpec("embed", str(minilm_dir)), minilm_dir)
    ours = embedder.score(TEXTS)
    peer = sentence_transformer.encode(TEXTS, normalize_embeddings=True)
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), 384)
    assert cosine(ours, peer).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert embedder.max_seq_length == 256  # from the model's sentence_bert_config.json


def test_max_seq_length_override_changes_long_texts_only(minilm_dir):
    default = load_embedder(ModelSpec("embed", str(minilm_dir)), minilm_dir)
    short = load_embedder(ModelSpec("embed", str(minilm_dir), max_seq_length=16), minilm_dir)
    texts = [" ".join(TEXTS[0] for _ in range(4)), "short"]  # ~56 tokens, and 3
    a, b = default.score(texts), short.score(texts)
    assert cosine(a[[0]], b[[0]])[0] < 0.99  # cut at 16 tokens changes the long text
    assert cosine(a[[1]], b[[1]])[0] > 0.9999  # "short" fits either way


def test_pooling_override_conflicts_with_model_config(minilm_dir):
    with pytest.raises(ValueError, match="conflicts with the pooling fixed by"):
        load_embedder(ModelSpec("embed", str(minilm_dir), pooling="cls"), minilm_dir)


def reference_pooling(model_dir, texts, mode):
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        tokens = model(**batch).last_hidden_state
    if mode == "cls":
        pooled = tokens[:, 0]
    else:
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (tokens * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()


@pytest.mark.parametrize("mode", ["mean", "cls"])
def test_plain_hf_directory_uses_configured_pooling(plain_bert_dir, mode):
    texts = ["a first review", "another, longer review text with more tokens", "x"]
    embedder = load_embedder(
        ModelSpec("embed", str(plain_bert_dir), pooling=None if mode == "mean" else mode), plain_bert_dir
    )
    ours = embedder.score(texts)
    assert cosine(ours, reference_pooling(plain_bert_dir, texts, mode)).min() >= 0.9999


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("mode", ["weightedmean", "lasttoken", ("lasttoken", "mean")])
def test_position_pooling_matches_sentence_transformers_either_side_padded(
    plain_bert_dir, tmp_path, mode, padding_side
):
    """``lasttoken`` (decoder embedders, which pad left) and ``weightedmean`` depend on where the real tokens are."""
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(str(plain_bert_dir))
    transformer.tokenizer.padding_side = padding_side
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode=mode)
    SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu").save(str(tmp_path))
    peer = SentenceTransformer(str(tmp_path), device="cpu").encode(TEXTS)  # one batch, padded as ours
    embedder = load_embedder(ModelSpec("embed", str(tmp_path)), tmp_path)
    assert embedder.padding_side == padding_side and embedder.pooling == ((mode,) if isinstance(mode, str) else mode)
    np.testing.assert_allclose(embedder.score(TEXTS), peer, atol=1e-5)


def _prompted_model(plain_bert_dir, path, default_prompt_name=None, include_prompt=True, dense=False):
    """A sentence-transformers model over ``plain_bert_dir`` with e5-style prompts (and a seeded ``Dense`` projection
    after the pooling when ``dense``), saved to ``path``."""
    from sentence_transformers import SentenceTransformer, models

    torch.manual_seed(0)
    transformer = models.Transformer(str(plain_bert_dir))
    pooling = models.Pooling(
        transformer.get_word_embedding_dimension(), pooling_mode="mean", include_prompt=include_prompt
    )
    projection = (
        [models.Dense(pooling.get_sentence_embedding_dimension(), 16, activation_function=torch.nn.Tanh())]
        if dense
        else []
    )
    SentenceTransformer(
        modules=[transformer, pooling, *projection, models.Normalize()],
        device="cpu",
        prompts={"query": "query: ", "passage": "passage: ", "plain": ""},
        default_prompt_name=default_prompt_name,
    ).save(str(path))
    return SentenceTransformer(str(path), device="cpu")


@pytest.mark.parametrize("default_prompt_name", [None, "query"])
def test_prompts_are_prepended_as_sentence_transformers_does(plain_bert_dir, tmp_path, default_prompt_name):
    """No ``prompt_name``: the model's default prompt, if it names one; a ``prompt_name``: that prompt."""
    peer = _prompted_model(plain_bert_dir, tmp_path, default_prompt_name)
    for prompt_name in (None, "passage"):
        ours = load_embedder(ModelSpec("embed", str(tmp_path), prompt_name=prompt_name), tmp_path).score(TEXTS)
        np.testing.assert_allclose(ours, peer.encode(TEXTS, prompt_name=prompt_name), atol=1e-5)
    bare = load_embedder(ModelSpec("embed", str(tmp_path), prompt_name="plain"), tmp_path).score(TEXTS)
    assert (
        cosine(
            bare, load_embedder(ModelSpec("embed", str(tmp_path), prompt_name="passage"), tmp_path).score(TEXTS)
        ).min()
        < 0.999
    )


def test_modules_beyond_pooling_run_through_sentence_transformers_on_torch_only(plain_bert_dir, tmp_path):
    """A ``Dense`` projection: sentence-transformers runs the module chain (prompt prepended by the head); onnx
    refuses."""
    peer = _prompted_model(plain_bert_dir, tmp_path, dense=True)
    for prompt_name in (None, "passage"):
        ours = load_embedder(ModelSpec("embed", str(tmp_path), prompt_name=prompt_name), tmp_path).score(TEXTS)
        assert ours.shape == (len(TEXTS), 16)
        np.testing.assert_allclose(ours, peer.encode(TEXTS, prompt_name=prompt_name), atol=1e-5)
    with pytest.raises(
        ValueError, match=r"modules beyond Transformer, Pooling and Normalize; they run on the torch backend only"
    ):
        load_embedder(ModelSpec("embed", str(tmp_path), backend="onnx"), tmp_path)


def test_a_prompt_the_model_lacks_or_cannot_pool_is_refused(plain_bert_dir, tmp_path):
    _prompted_model(plain_bert_dir, tmp_path / "e5")
    with pytest.raises(
        ValueError,
        match=r"model.prompt_name 'summary' is not one of the model's prompts: document, passage, plain, query",
    ):
        load_embedder(ModelSpec("embed", str(tmp_path / "e5"), prompt_name="summary"), tmp_path / "e5")
    _prompted_model(plain_bert_dir, tmp_path / "instructor", include_prompt=False)
    with pytest.raises(ValueError, match=r"pools without its prompt's tokens \(include_prompt: false\)"):
        load_embedder(ModelSpec("embed", str(tmp_path / "instructor"), prompt_name="query"), tmp_path / "instructor")
    load_embedder(
        ModelSpec("embed", str(tmp_path / "instructor")), tmp_path / "instructor"
    )  # no prompt: nothing to leave out


def test_normalize_off_keeps_raw_pooled_vectors(plain_bert_dir):
    embedder = load_embedder(ModelSpec("embed", str(plain_bert_dir), normalize=False), plain_bert_dir)
    norms = np.linalg.norm(embedder.score(["one", "two words here"]), axis=1)
    assert not np.allclose(norms, 1.0)


def test_pickle_weights_are_not_loaded(tmp_path, plain_bert_dir):
    """Only safetensors load: a directory holding only pytorch_model.bin is refused."""
    from transformers import BertModel

    # transformers 5 always saves safetensors; write the pickle checkpoint the old way.
    torch.save(BertModel.from_pretrained(str(plain_bert_dir)).state_dict(), tmp_path / "pytorch_model.bin")
    for path in plain_bert_dir.iterdir():
        if path.suffix != ".safetensors":
            (tmp_path / path.name).write_bytes(path.read_bytes())
    assert not list(tmp_path.glob("*.safetensors"))
    # The guard's own error, before transformers is asked: without the guard, loading fails later
    # with transformers' "no safetensors file" OSError, which this does not accept.
    with pytest.raises(ModelSourceError, match="pickle-based weights.*allow_pickle"):
        load_embedder(ModelSpec("embed", str(tmp_path)), tmp_path)
