"""spark-submit's primary resource: ``spark-submit [options] launcher.py score --input ...``.

spark-submit needs a ``.py`` file, not a console script. This one runs
:func:`lakescore.jobs.cli.main` with the application arguments, stops the SparkSession
the run used, and exits with the CLI's code. lakescore itself must be
importable from the installed wheel (the env archive or the cluster's Python);
nothing is imported from beside this file. Not for Databricks wheel tasks: they
call the ``lakescore`` entry point and keep their session.
"""

import os
import sys

if __name__ == "__main__":
    # Python put this file's directory first on sys.path; inside a source tree that is
    # jobs/, whose modules (config, report, api, ...) would shadow top-level names.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    from lakescore.jobs.cli import main

    code = main()
    # A spark-submit application stops its own context. Left to the JVM's exit, a standalone
    # cluster sees its executors die and launches replacements while it shuts down.
    if "pyspark.sql" in sys.modules:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        if session is not None:
            session.stop()
    sys.exit(code)
