"""A generate run over an endpoint in a session lakescore builds itself, with the key only in
``spark.executorEnv.<NAME>`` (as docs/generation.md says to give it), the event log on and the UI up: run as a
process of its own by tests/integration/test_endpoint_job.py, which then greps everything the run left for the key.

``python -m tests.integration.key_hidden_run URL MODEL SOURCE OUTPUT WORK NAME``, the key on stdin (never in argv or
the driver's environment). Writes ``WORK/environment.json`` (the UI's ``/api/v1/applications/<id>/environment``
answer, taken while the session runs) and ``WORK/run.json`` (and its HTML) with the event log under ``WORK/events``.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path


def main(url: str, model: str, source: str, output: str, work: str, name: str) -> int:
    from pyspark.sql import SparkSession

    from lakescore.jobs.config import load_config
    from lakescore.jobs.score_job import run_scoring
    from lakescore.jobs.steps.metrics import record_run

    key = sys.stdin.read().strip()
    folder = Path(work)
    (folder / "events").mkdir(parents=True, exist_ok=True)
    cfg = load_config(
        flags={
            "input": source,
            "output": output,
            "task": "generate",
            "id_col": "review_id",
            "generate.prompt_template": "Review: {body}\nSummary:",
            "generate.max_new_tokens": 4,
            "max_error_rate": 0.5,
            "generate.endpoint.url": url,
            "generate.endpoint.model": model,
            "generate.endpoint.api_key_env": name,
            "report": str(folder / "run.json"),
            "spark.master": "local[1]",
            "spark.warehouse_dir": str(folder / "warehouse"),
            "spark.metastore_dir": str(folder / "metastore_db"),
            "spark.conf": {
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": (folder / "events").as_uri(),
                "spark.ui.enabled": "true",
                "spark.ui.port": "0",
                f"spark.executorEnv.{name}": key,
            },
        }
    )
    report = run_scoring(cfg)
    spark = SparkSession.getActiveSession()
    record_run(spark, cfg, report)
    context = spark.sparkContext
    with urllib.request.urlopen(
        f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/environment"
    ) as answer:
        (folder / "environment.json").write_bytes(answer.read())
    spark.stop()
    print(json.dumps({"status": report.status, "error": report.error}))
    return 0 if report.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
