"""Which runs group rows by prompt prefix (``scoring.group_prefixes``), and when the scoring stage shuffles at all:
the decisions :func:`~lakescore.jobs.steps.score.score_dataframe` takes, without a JVM (the partitioning itself runs
on Spark in ``tests/integration/test_endpoint_job.py``)."""

from __future__ import annotations

import pytest

from lakescore.jobs.config import config_from_mapping
from lakescore.jobs.steps.score import scoring_shuffle

BASE = {"task": "generate", "input": "/data/docs", "output": "/data/answers", "id_col": "id", "text_col": "question"}
ENDPOINT = {"endpoint": {"url": "http://127.0.0.1:8000/v1", "model": "m"}}
SERVER = {"server": {"engine": "vllm"}}


@pytest.mark.parametrize(
    ("settings", "grouped"),
    [
        ({"generate": ENDPOINT}, True),
        ({"generate": SERVER}, True),
        ({"generate": {**ENDPOINT, "temperature": 0.7}}, True),  # a sampled row's seed is its id's: order is free
        ({"model": "/models/tiny"}, False),  # in process: neighbours in a padded batch could flip a greedy tie
        ({"generate": SERVER, "scoring": {"group_prefixes": False}}, False),
        ({"task": "embed", "embed": ENDPOINT}, False),  # a vector has no prefix cache to feed
    ],
    ids=["endpoint", "server", "sampled", "in-process", "off", "embed"],
)
def test_prompts_sent_as_requests_are_grouped_unless_turned_off(settings, grouped):
    cfg = config_from_mapping({**BASE, **settings})
    assert cfg.groups_prefixes is grouped


def test_images_with_prompts_are_not_grouped_their_image_comes_first():
    server = {"server": {"engine": "vllm", "api": "chat"}, "prompt_template": "Describe {name}"}
    cfg = config_from_mapping(
        {**{k: v for k, v in BASE.items() if k != "text_col"}, "image_col": "photo"} | {"generate": server}
    )
    assert cfg.groups_prefixes is False


@pytest.mark.parametrize(
    ("planned", "target", "configured", "shuffled"),
    [(1, 8, False, True), (8, 8, False, False), (16, 8, False, False), (16, 8, True, True), (None, 8, False, True)],
)
def test_the_stage_shuffles_when_its_input_has_too_few_partitions_or_unknown_or_tasks_are_configured(
    planned, target, configured, shuffled
):
    assert scoring_shuffle(planned, target, configured) is shuffled
