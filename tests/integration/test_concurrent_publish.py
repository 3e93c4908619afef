"""Two runs publishing at once: runs of different dates in ``write.mode: replace_run`` both publish.

Each ``replaceWhere run_id = '<run>'`` commit reads and replaces only its own ``run_id`` partition, so Delta's
conflict detection finds no overlap. The two runs are threads of this process on the test session (one JVM:
Delta's optimistic concurrency is the same for two processes on one filesystem); a barrier at the publish step
proves both had staged and validated before either committed. The tiny seeded tabular model.
"""

from __future__ import annotations

import threading

from lakescore.jobs.config import load_config
from lakescore.jobs.platform.tables import delta_history
from lakescore.jobs.score_job import run_scoring
from lakescore.jobs.testing_hooks import BARRIER_ENV
from tests.integration.test_pinned_publish import _accounts

ROWS = 80


def test_concurrent_replace_run_of_different_dates_both_publish(spark, tmp_path, tiny_tabular, monkeypatch):
    _, script, _ = tiny_tabular
    source, output = tmp_path / "accounts.parquet", tmp_path / "daily"
    frame = _accounts(ROWS, seed=6)
    frame.loc[4, "feature_c"] = float("nan")  # one dead-lettered row per run: both write their errors partition
    frame.to_parquet(source)

    def config(date: str):
        return load_config(
            flags={
                "input": str(source),
                "output": str(output),
                "task": "tabular",
                "model.source": str(script),
                "id_col": "account_id",
                "feature_prefix": "feature_",
                "run_date": date,
                "write.mode": "replace_run",
                "max_error_rate": 0.05,
            }
        )

    assert run_scoring(config("2026-11-18"), spark).status == "succeeded"  # the table exists, partitioned by run_id
    barrier = tmp_path / "barrier"
    monkeypatch.setenv(BARRIER_ENV, f"publish:2:{barrier}")
    results: dict[str, object] = {}

    def run(date: str) -> None:
        try:
            results[date] = run_scoring(config(date), spark)
        except BaseException as exc:  # reported below
            results[date] = exc

    threads = [threading.Thread(target=run, args=(d,)) for d in ("2026-11-19", "2026-11-20")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    monkeypatch.delenv(BARRIER_ENV)

    arrivals = [float(p.read_text()) for p in barrier.glob("arrived-*")]
    assert len(arrivals) == 2, "the runs did not both reach the publish step: they never overlapped"
    for date, report in results.items():
        assert not isinstance(report, BaseException), f"{date}: {report!r}"
        assert report.status == "succeeded", (date, report.error)
    out = spark.read.format("delta").load(str(output)).toPandas()
    assert out.groupby("run_id").size().to_dict() == {
        "2026-11-18": ROWS - 1,
        "2026-11-19": ROWS - 1,
        "2026-11-20": ROWS - 1,
    }
    assert not out.duplicated(["run_id", "account_id"]).any()
    errors = spark.read.format("delta").load(f"{output}_errors").toPandas()
    assert errors.groupby("run_id").size().to_dict() == {"2026-11-18": 1, "2026-11-19": 1, "2026-11-20": 1}
    tagged = [h.run_id for h in delta_history(spark, str(output))]
    assert sorted(tagged) == ["2026-11-18", "2026-11-19", "2026-11-20"]  # one commit each
    published_at = {h.run_id: h.version for h in delta_history(spark, str(output))}
    assert {results[d].delta_version for d in ("2026-11-19", "2026-11-20")} == {
        published_at["2026-11-19"],
        published_at["2026-11-20"],
    }
