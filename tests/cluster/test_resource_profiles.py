"""Resource profiles on real Spark, each scenario in its own process (tests/integration owns this
process's one SparkContext): a multi-JVM ``local-cluster`` with fake executor GPUs honours the
scoring profile; a ``local[2]`` master runs without it and warns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCENARIO = Path(__file__).with_name("scenario.py")
REPO = SCENARIO.parents[2]


def run_scenario(master: str, workdir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.update(PYSPARK_PYTHON=sys.executable, HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, str(SCENARIO), master, str(workdir)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_scored_every_row(result: dict) -> None:
    assert result["scored_rows"] == 40 and result["scored_ids"] == list(range(40))
    assert result["unscored_rows"] == 0 and result["embedding_dims"] == [384]
    assert result["rows_scored_by_workers"] == 40


def test_local_cluster_runs_the_scoring_stage_with_its_gpu_profile(tmp_path):
    result = run_scenario("local-cluster[2,1,1024]", tmp_path)
    assert_scored_every_row(result)
    assert result["warnings"] == []
    profiled = [s for s in result["stages"] if s["profile"] != 0]
    # Two profiled stages: the scoring stage and the probe, each behind a repartition; every stage that
    # reads the input kept the default profile (0).
    assert len(profiled) == 2 and all(s["status"] == "COMPLETE" for s in profiled), result["stages"]
    scoring = min(profiled, key=lambda s: s["id"])
    assert scoring["tasks"] == 2  # resources.scoring.partitions
    assert {s["profile"] for s in result["stages"] if s["id"] < scoring["id"]} == {0}
    assert result["profiles"][str(scoring["profile"])]["gpu"]["amount"] == 1.0
    assert result["profiles"][str(scoring["profile"])]["cpus"]["amount"] == 1.0
    # Every task of the profiled probe saw exactly one GPU of its own, from the discovered addresses.
    probe = result["probe"]
    assert sorted(t["partition"] for t in probe) == [0, 1, 2, 3] and sum(t["rows"] for t in probe) == 40
    assert all(len(t["gpus"]) == 1 and t["gpus"][0] in ("0", "1") and t["cpus"] == 1 for t in probe), probe


def test_local_master_runs_without_the_profile_and_warns(tmp_path):
    result = run_scenario("local[2]", tmp_path)
    assert_scored_every_row(result)
    assert len(result["warnings"]) == 2  # the scoring stage, then the probe
    assert "Spark master 'local[2]' cannot honour resource profiles" in result["warnings"][0]
    assert {s["profile"] for s in result["stages"]} == {0}
    assert all(t["gpus"] == [] for t in result["probe"])
