"""The head contract (udfs/heads/protocol.py): every head is a ``Head``, and has exactly the opt-in parts the core
tells apart by ``isinstance``, so a head that gains or loses one (a renamed method) fails here, not in a run."""

from __future__ import annotations

import pytest

from lakescore.udfs.heads import protocol as p


def _heads():
    from lakescore.udfs.chunking import ChunkedEmbedder
    from lakescore.udfs.heads.classify import SequenceClassifier
    from lakescore.udfs.heads.embed import SentenceEmbedder
    from lakescore.udfs.heads.generate import Generator
    from lakescore.udfs.heads.image_classify import ImageClassifier
    from lakescore.udfs.heads.image_embed import ImageEmbedder
    from lakescore.udfs.heads.image_prompts import ImagePromptGenerator
    from lakescore.udfs.heads.ner import TokenClassifier
    from lakescore.udfs.heads.tabular import TabularModel
    from lakescore.udfs.remote.embed import EndpointEmbedder
    from lakescore.udfs.remote.generate import EndpointGenerator
    from lakescore.udfs.remote.image_prompts import EndpointImageGenerator
    from lakescore.udfs.remote.transcribe import EndpointTranscriber

    remote = {p.MetersTraffic, p.PlansOwnBudget, p.HoldsResources, p.ChecksFidelity}
    return {
        SequenceClassifier: {p.ChecksFidelity},
        TokenClassifier: {p.ChecksFidelity},
        SentenceEmbedder: {p.ChecksFidelity},
        ChunkedEmbedder: {p.ChecksFidelity, p.PreparesBatches},
        TabularModel: set(),
        ImageClassifier: {p.ChecksFidelity},
        ImageEmbedder: {p.ChecksFidelity},
        Generator: {p.ChecksFidelity, p.PlansOwnBudget},
        ImagePromptGenerator: {p.ChecksFidelity, p.PlansOwnBudget},
        EndpointGenerator: remote,
        EndpointImageGenerator: remote,
        EndpointEmbedder: remote | {p.PreparesBatches},
        EndpointTranscriber: {p.MetersTraffic, p.PlansOwnBudget, p.HoldsResources, p.SendsRecordings},
    }


OPT_IN = (
    p.PreparesBatches,
    p.SendsRecordings,
    p.MetersTraffic,
    p.PlansOwnBudget,
    p.ChecksFidelity,
    p.HoldsResources,
)
"""The parts made of methods only, which a class can be checked against; those with data (``ServedElsewhere``'s
identity, ``ChunksDocuments``' embedder) are checked on made heads (test_endpoint_client.py, test_chunking.py)."""


@pytest.mark.parametrize("head", list(_heads()), ids=lambda head: head.__name__)
def test_each_head_is_a_head_with_exactly_the_parts_it_claims(head):
    assert issubclass(head, p.Head)
    assert {part for part in OPT_IN if issubclass(head, part)} == _heads()[head]
