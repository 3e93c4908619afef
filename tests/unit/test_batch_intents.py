"""Finding again a batch created but not recorded, where batches keep no metadata (issue 67: Anthropic's Message
Batches): intents matched to the provider's list by time, request count and, once ended, results' custom_ids."""

from __future__ import annotations

from lakescore.udfs.remote.batch_intents import CLOCK_SKEW_S, Intent, Listed, intents_by_part, match_intents

RESULTS = {"ended-a": ["a2", "a1"], "ended-b": ["b1"], "ended-empty": []}


def _ids(batch: Listed) -> list[str]:
    return RESULTS[batch.batch_id]


def test_an_ended_batch_is_the_intent_its_results_name_and_no_other_of_the_same_size() -> None:
    a, b = Intent("pa", 2, ("a1", "a2"), 1000.0), Intent("pb", 2, ("b1", "b2"), 1000.0)
    listed = [Listed("ended-b", 1010.0, 2, True, "u"), Listed("ended-a", 1005.0, 2, True, "u")]
    found = match_intents([a, b], listed, _ids)
    assert found.adopted == {"pa": "ended-a", "pb": "ended-b"} and not found.ambiguous  # b1 alone: one line vanished


def test_a_running_batch_is_adopted_only_when_it_is_the_one_candidate_of_the_one_intent() -> None:
    a = Intent("pa", 3, ("a1",), 1000.0)
    assert match_intents([a], [Listed("run", 1001.0, 3, False)], _ids).adopted == {"pa": "run"}
    # created long before the intent, another size, or recorded already: not this file's
    others = [Listed("old", 1000.0 - CLOCK_SKEW_S - 1, 3, False), Listed("big", 1001.0, 4, False)]
    assert match_intents([a], [*others, Listed("rec", 1002.0, 3, False)], _ids, frozenset({"rec"})).adopted == {}
    # the provider's clock a little behind the driver's: still a candidate
    assert match_intents([a], [Listed("skewed", 1000.0 - CLOCK_SKEW_S / 2, 3, False)], _ids).adopted == {"pa": "skewed"}


def test_running_batches_that_could_be_either_of_two_files_are_ambiguous_and_adopt_nothing() -> None:
    a, b = Intent("pa", 3, ("a1",), 1000.0), Intent("pb", 3, ("b1",), 1000.0)
    listed = [Listed("r2", 1003.0, 3, False), Listed("r1", 1002.0, 3, False)]
    found = match_intents([a, b], listed, _ids)
    assert found.adopted == {} and found.ambiguous == {"pa": ["r1", "r2"], "pb": ["r1", "r2"]}
    # one file, two running batches of its size: which one is unknown
    assert match_intents([a], listed, _ids).ambiguous == {"pa": ["r1", "r2"]}
    # an ended batch without results tells nothing: a candidate by time and size only
    assert match_intents([a], [Listed("ended-empty", 1001.0, 3, True, "u")], _ids).adopted == {"pa": "ended-empty"}


def test_the_latest_intent_of_a_part_is_the_one_matched() -> None:
    first, again = Intent("p", 2, ("x",), 100.0), Intent("p", 2, ("x",), 500.0)
    assert intents_by_part([again, first]) == {"p": again}


def test_the_plan_names_the_files_the_submit_stage_cuts_from_the_same_lines() -> None:
    """An intent is recorded for the file the submit stage will send: the plan, given each line's size alone in the
    stage's order, cuts the same files (part digest, lines, first ids) as the lines themselves are cut."""
    import pyarrow as pa

    from lakescore.udfs.batch_udfs import make_plan_function
    from lakescore.udfs.remote.batch_files import cut_grouped, part_digest
    from lakescore.udfs.remote.batch_intents import SAMPLE_IDS

    lines = [(i // 15, f"id{i:02d}", b"x" * (10 + i % 7)) for i in range(23)]  # two prefix groups
    halves = [lines[:11], lines[11:]]  # one partition, two Arrow batches
    batches = [
        pa.record_batch(
            [pa.array([g for g, _, _ in h]), pa.array([i for _, i, _ in h]), pa.array([len(x) for *_, x in h])],
            ["group", "custom_id", "size"],
        )
        for h in halves
    ]
    planned = pa.Table.from_batches(list(make_plan_function("run", 1, 5, 60)(iter(batches)))).to_pylist()
    cut = [[line_id for line_id, _ in part] for part in cut_grouped(lines, 5, 60)]
    assert len(cut) > 5 and not any("id14" in ids and "id15" in ids for ids in cut)  # byte limits; groups apart
    expected = [{"part": part_digest("run", 1, ids), "lines": len(ids), "first_ids": ids[:SAMPLE_IDS]} for ids in cut]
    assert planned == expected
