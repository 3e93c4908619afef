"""Chunked embedding of long documents (issue 59) against sentence-transformers on MiniLM: every chunk's vector is
``encode`` of its substring, every chunk fits the model, every character is in a chunk."""

import json
import shutil

import numpy as np
import pytest

from lakescore.udfs.batching import BatchPolicy
from lakescore.udfs.chunking import Chunker, TooManyChunks, chunked_embedder, embed_documents
from lakescore.udfs.heads.embed import load_embedder
from lakescore.udfs.models.model_source import ModelSpec

LONG = (
    "  The kettle boils fast and the lid closes firmly.\n\nSecond paragraph:  naïve café, Ünïcödé, 日本語のレビュー, "
    "عربي, emoji 🙂🔥 and   odd\tspacing; supercalifragilisticexpialidocious words split into pieces.  "
) * 4
DOCUMENTS = [LONG, "short", "", None, LONG[:90] + "\u200b\u200b" + LONG[90:200] + "   "]


def covered(text, spans):
    hit = np.zeros(len(text), dtype=bool)
    for start, end in spans:
        hit[start:end] = True
    return hit.all()


def cosine(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def embedder(minilm_dir):
    return load_embedder(ModelSpec("embed", str(minilm_dir)), minilm_dir)


def test_chunk_vectors_are_sentence_transformers_encode_of_each_span(embedder, sentence_transformer):
    from lakescore.udfs.heads.protocol import ChunksDocuments, PreparesBatches

    head = chunked_embedder(embedder, max_tokens=32, overlap_tokens=8, document_vector=True)
    assert isinstance(head, ChunksDocuments) and isinstance(head, PreparesBatches) and head.embedder is embedder
    scored = embed_documents(DOCUMENTS, head, BatchPolicy(256, 64))
    assert scored.reasons == [None, None, None, "null_input", None]
    tokenizer = sentence_transformer.tokenizer
    for text, document in zip(DOCUMENTS, scored.outputs):
        if text is None:
            assert document is None
            continue
        chunks = [text[start:end] for start, end in document.spans]
        assert covered(text, document.spans)
        assert document.spans[0][0] == 0 and document.spans[-1][1] == len(text)
        assert all(len(tokenizer(chunk)["input_ids"]) <= 32 for chunk in chunks)  # special tokens counted
        peer = sentence_transformer.encode(chunks, normalize_embeddings=True)
        assert document.vectors.shape == (len(chunks), 384)
        assert cosine(document.vectors, peer).min() >= 0.9999
        mean = peer.mean(0) / np.linalg.norm(peer.mean(0))
        assert cosine(document.document_vector[None], mean[None])[0] >= 0.9999
    long_spans = scored.outputs[0].spans
    assert len(long_spans) > 3
    assert all(b[0] < a[1] for a, b in zip(long_spans, long_spans[1:]))  # consecutive chunks overlap
    assert scored.outputs[1].spans == [(0, 5)] and scored.outputs[2].spans == [(0, 0)]  # a text that fits: one chunk


def test_overlap_is_the_tokens_consecutive_windows_share(embedder):
    text = " ".join(f"w{i}" for i in range(200))  # words of one to three word pieces
    tokenizer = embedder.tokenizer
    whole = tokenizer(text, add_special_tokens=False)["input_ids"]
    spans = Chunker(tokenizer, 24, 6).spans(text)
    ids = [tokenizer(text[s:e], add_special_tokens=False)["input_ids"] for s, e in spans]
    assert all(len(i) <= 22 for i in ids) and len(ids) > 5
    assert all(any(i == whole[k : k + len(i)] for k in range(len(whole))) for i in ids)  # cut at words: the same tokens
    for a, b in zip(ids, ids[1:]):
        shared = max(k for k in range(len(b) + 1) if a[len(a) - k :] == b[:k])
        assert 6 <= shared <= 8  # the last overlap_tokens of a window start the next one (and the word they cut)
    no_overlap = Chunker(tokenizer, 24, 0).spans(text)
    assert all(a[1] <= b[0] for a, b in zip(no_overlap, no_overlap[1:])) and covered(text, no_overlap)


def test_the_prompt_counts_against_max_tokens(minilm_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    model_dir = tmp_path / "prompted"
    shutil.copytree(minilm_dir, model_dir)
    settings = model_dir / "config_sentence_transformers.json"
    config = json.loads(settings.read_text()) if settings.exists() else {}
    settings.write_text(
        json.dumps({**config, "prompts": {"passage": "passage of a long document: "}, "default_prompt_name": "passage"})
    )
    head = chunked_embedder(
        load_embedder(ModelSpec("embed", str(model_dir)), model_dir), max_tokens=24, overlap_tokens=4
    )
    document = embed_documents([LONG], head, BatchPolicy(512, 64)).outputs[0]
    peer_model = SentenceTransformer(str(model_dir), device="cpu")
    chunks = [LONG[s:e] for s, e in document.spans]
    assert all(len(peer_model.tokenizer("passage of a long document: " + c)["input_ids"]) <= 24 for c in chunks)
    peer = peer_model.encode(chunks, normalize_embeddings=True)  # the default prompt, as the model says
    assert cosine(document.vectors, peer).min() >= 0.9999 and covered(LONG, document.spans)


def test_byte_level_tokenizer_spans_fit_and_cover(tmp_path):
    """A GPT-2 style tokenizer makes spaces part of tokens and splits a character into several: windows shorten
    where a boundary would not read back as the same tokens, and still cover the text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        [LONG] * 3, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    chunker = Chunker(tokenizer, 16, 3)
    for text in (LONG, "   leading and trailing   ", "🙂🔥日本語" * 20):
        spans = chunker.spans(text)
        assert covered(text, spans) and spans[0][0] == 0 and spans[-1][1] == len(text)
        assert all(len(tokenizer(text[s:e])["input_ids"]) <= 16 for s, e in spans)


def test_a_document_over_max_chunks_is_dead_lettered_whole(embedder):
    head = chunked_embedder(embedder, max_tokens=32, overlap_tokens=0, max_chunks=3)
    scored = embed_documents([LONG, "short"], head, BatchPolicy(256, 64))
    assert scored.reasons == ["too_many_chunks", None] and scored.outputs[0] is None
    assert "over embed.chunk.max_chunks 3" in scored.errors[0]
    huge = "lorem ipsum dolor sit amet " * 40_000  # ~1 MB: refused from its token count, no window built
    with pytest.raises(TooManyChunks):
        Chunker(embedder.tokenizer, 256, 32, max_chunks=100).spans(huge)


def test_settings_a_model_cannot_take_are_refused(embedder):
    with pytest.raises(ValueError, match="above the 256 tokens the model reads"):
        chunked_embedder(embedder, max_tokens=512)
    with pytest.raises(ValueError, match="overlap_tokens must be below"):
        chunked_embedder(embedder, max_tokens=32, overlap_tokens=30)
    with pytest.raises(ValueError, match="leaves no token of text"):
        chunked_embedder(embedder, max_tokens=2)


def test_max_tokens_above_the_models_limit_is_refused_on_the_driver_from_its_files(embedder, minilm_dir, tmp_path):
    """Issue 65: the driver reads the limit the executors' load uses (256 for MiniLM: its sentence_bert_config) from the
    model's files, so the run fails in one line before any executor loads the model."""
    from lakescore.udfs.models.model_fit import check_model_fits
    from lakescore.udfs.models.model_source import UnfitModelError
    from lakescore.udfs.options.embed import ChunkOptions, EmbedOptions

    def spec(most, **kw):
        return ModelSpec("embed", str(minilm_dir), embed=EmbedOptions(chunk=ChunkOptions(max_tokens=most)), **kw)

    check_model_fits(spec(embedder.max_seq_length), minilm_dir)
    with pytest.raises(UnfitModelError) as refused:
        check_model_fits(spec(embedder.max_seq_length + 1), minilm_dir)
    assert str(refused.value) == (
        f"task embed: embed.chunk.max_tokens {embedder.max_seq_length + 1} is above the {embedder.max_seq_length} "
        f"tokens the model reads, which would truncate every full chunk; set it at most {embedder.max_seq_length} "
        f"({minilm_dir})"
    )
    with pytest.raises(UnfitModelError, match="above the 64 tokens"):  # model.max_seq_length lowers it, as on executors
        check_model_fits(spec(65, max_seq_length=64), minilm_dir)
    # the tokenizer's own limit counts too, as the executors' truncation_limit reads it
    copy = tmp_path / "minilm"
    shutil.copytree(minilm_dir, copy)
    settings = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**settings, "model_max_length": 100}))
    (copy / "sentence_bert_config.json").unlink()
    assert load_embedder(ModelSpec("embed", str(copy)), copy).max_seq_length == 100
    with pytest.raises(UnfitModelError, match="above the 100 tokens"):
        check_model_fits(spec(101), copy)
