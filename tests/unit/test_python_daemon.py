"""The Python daemon's preload and the session settings that select it (no Spark needed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pyspark
import pytest

from lakescore.jobs.config import SparkConfig
from lakescore.jobs.platform.spark.local import python_daemon
from lakescore.jobs.platform.spark.local.own_host import worker_preload_confs
from lakescore.udfs.registry import TASKS, get_task


def test_preload_keeps_stdout_for_the_port_and_survives_a_failing_import(tmp_path):
    """Spark reads the daemon's port from its stdout: what modules print at import, from Python or from native
    code, goes to stderr. A module that fails to import is named on stderr and the rest still import."""
    (tmp_path / "noisy_module.py").write_text("import os\nprint('python print')\nos.write(1, b'native write\\n')\n")
    (tmp_path / "broken_module.py").write_text("raise RuntimeError('broken on purpose')\n")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from lakescore.jobs.platform.spark.local.python_daemon import preload
        imported = preload(["noisy_module", "broken_module", " json ", ""])
        print("PORT", ",".join(imported))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "PORT noisy_module,json\n"
    assert "python print" in done.stderr and "native write" in done.stderr
    assert "could not preload broken_module: RuntimeError: broken on purpose" in done.stderr


def test_the_installed_pysparks_own_zip_leaves_the_path_and_a_clusters_stays():
    """pip's pyspark is its own SPARK_HOME: the pyspark.zip inside it is the package's code, uncompiled. A cluster's
    Spark elsewhere keeps its zip; py4j's zip stays (its import is 0.05 s either way)."""
    own = Path(pyspark.__file__).parent / "python" / "lib"
    path = [
        "",
        str(own / "pyspark.zip"),
        str(own / "py4j-0.10.9.9-src.zip"),
        "/opt/spark/python/lib/pyspark.zip",
        "/site",
    ]
    assert python_daemon.installed_pyspark_first(path) == ["", path[2], path[3], "/site"]


def test_a_built_session_names_the_daemon_and_its_imports():
    confs = worker_preload_confs(SparkConfig(), ("torch", "transformers.modeling_utils"))
    assert confs == {
        "spark.python.daemon.module": python_daemon.__name__,
        f"spark.executorEnv.{python_daemon.IMPORTS_ENV}": "torch,transformers.modeling_utils",
    }


@pytest.mark.parametrize(
    "cfg, imports",
    [
        (SparkConfig(worker_preload=False), ("torch",)),
        (SparkConfig(conf={"spark.python.daemon.module": "my.daemon"}), ("torch",)),
        (SparkConfig(), ()),
        (SparkConfig(master="spark://127.0.0.1:7077"), ("torch",)),  # a cluster's executors keep Spark's own daemon
        (SparkConfig(master="yarn"), ("torch",)),
    ],
    ids=["turned off", "the user's own daemon", "nothing to import", "standalone cluster", "yarn"],
)
def test_no_daemon_settings_when_off_overridden_empty_or_on_a_cluster(cfg, imports):
    assert worker_preload_confs(cfg, imports) == {}


def test_every_task_and_backend_names_importable_modules():
    """A misspelt module would only print a line in every executor's log: import them all here."""
    for task in TASKS.values():
        for backend in task.backends:
            for kind in (task.input_kind, *task.other_inputs):
                names = task.worker_imports(backend, kind)
                assert names[0] == "lakescore.udfs.scoring_udf"
                assert python_daemon.preload(names) == list(names), (task.name, backend, kind.runner_ref)


def test_the_onnx_backend_preloads_no_torch():
    """A worker on the ONNX backend never imports torch; its daemon must not either (a fresh interpreter)."""
    names = [
        n
        for task in TASKS.values()
        for backend in task.backends
        if backend == "onnx"
        for n in task.worker_imports(backend)
    ]
    code = (
        "import sys; from lakescore.jobs.platform.spark.local.python_daemon import preload; "
        f"preload({names!r}); print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert "transformers.modeling_utils" in get_task("embed").worker_imports("torch")


def test_the_daemon_is_told_from_the_jvm_that_names_it():
    """Process classifiers (fault tests, the bench's memory figures) look for the daemon by its command line; the
    driver JVM's names the module too, in its settings, and must not count as a Python worker."""
    assert python_daemon.runs_daemon(["/venv/bin/python", "-m", python_daemon.__name__, "pyspark.worker"])
    jvm = [
        "java",
        "-cp",
        "x",
        "org.apache.spark.deploy.SparkSubmit",
        "--conf",
        f"spark.python.daemon.module={python_daemon.__name__}",
    ]
    assert not python_daemon.runs_daemon(jvm)
    assert not python_daemon.runs_daemon(["/venv/bin/python", "-m", "pyspark.daemon", "pyspark.worker"])


def test_preloaded_objects_are_frozen_before_the_fork():
    """After the preload the daemon freezes what it imported, so collections in its workers leave those pages shared."""
    code = (
        "import gc; from lakescore.jobs.platform.spark.local.python_daemon import freeze_for_fork, preload; "
        "preload(['json', 'decimal']); before = gc.get_freeze_count(); freeze_for_fork(); "
        "print(before, gc.get_freeze_count() > 1000, gc.isenabled())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True", "True"]  # frozen, and workers still collect their own garbage
