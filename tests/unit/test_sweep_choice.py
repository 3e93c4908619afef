from lakescore.jobs.commands.sweep import SweepPoint, format_sweep, recommend


def point(tokens, rate, error=None):
    return SweepPoint(tokens, 256, 100, rate, None if error else 1000.0, error)


def test_recommends_fastest_and_prefers_smaller_budget_on_near_ties():
    points = [point(512, 30.0), point(1024, 41.0), point(2048, 41.5), point(4096, 35.0)]
    assert recommend(points).max_batch_tokens == 1024  # 41.0 is within 3% of 41.5: less memory wins
    assert recommend([point(512, 10.0), point(1024, 20.0)]).max_batch_tokens == 1024


def test_out_of_memory_points_are_listed_but_never_recommended():
    points = [point(8192, 100.0), point(16384, None, error="out of memory")]
    assert recommend(points).max_batch_tokens == 8192
    text = format_sweep(points)
    assert "16384" in text and "stopped: out of memory" in text
    assert text.splitlines()[-1] == "recommended: --set scoring.max_batch_tokens=8192"
    assert recommend([point(8192, None, error="out of memory")]) is None
