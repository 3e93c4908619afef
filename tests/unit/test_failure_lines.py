"""A failure's one line names its root cause, from the error's cause chain; here the chains that need no JVM: Spark
Connect's (text: the server's stack trace) and Python's own. Classic sessions' Java chains: tests/integration
(test_bad_inputs.py)."""

from __future__ import annotations

import errno

from pyspark.errors.exceptions.connect import SparkConnectGrpcException

from lakescore.jobs.platform.tables import TableError, cause_chain, failure_reason, unreadable_input
from lakescore.jobs.report.text import one_line


def _connect_error(message: str, *causes: str) -> SparkConnectGrpcException:
    """An error as a Spark Connect client receives it: the outermost message, the server's trace carried beside it."""
    trace = "\n".join(
        ["org.apache.spark.SparkException", "\tat org.apache.spark.Foo.bar(Foo.scala:1)"]
        + [line for cause in causes for line in (f"Caused by: {cause}", "\tat x.Y.z(Y.java:2)")]
    )
    return SparkConnectGrpcException(message=message, server_stacktrace=trace)


def test_a_full_disk_over_connect_is_named_with_the_path_written():
    exc = _connect_error(
        "[TASK_WRITE_FAILED] Task failed while writing rows to s3a://bucket/out. SQLSTATE: 58030",
        "org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device",
        "java.io.IOException: No space left on device",
    )
    assert cause_chain(exc)[-1] == "java.io.IOException: No space left on device"
    assert failure_reason(exc) == one_line(exc) == "no space left on device writing s3a://bucket/out"


def test_any_other_spark_error_keeps_its_message_and_adds_its_root_cause():
    exc = _connect_error("[INTERNAL_ERROR] The job failed.", "java.lang.OutOfMemoryError: Java heap space")
    assert one_line(exc) == "[INTERNAL_ERROR] The job failed.; root cause: java.lang.OutOfMemoryError: Java heap space"
    assert one_line(_connect_error("[X] only a message")) == "[X] only a message"


def test_an_unreadable_input_file_over_connect_names_the_file_and_the_readers_reason():
    exc = _connect_error(
        "[FAILED_READ_FILE.NO_HINT] Encountered error while reading file s3a://bucket/in/part-1.parquet. SQLSTATE: "
        "KD001",
        "java.lang.RuntimeException: part-1.parquet is not a Parquet file",
    )
    assert (
        unreadable_input(exc)
        == one_line(exc)
        == (
            "cannot read input file s3a://bucket/in/part-1.parquet: java.lang.RuntimeException: part-1.parquet is not "
            "a Parquet file"
        )
    )


def test_python_errors_a_full_or_read_only_filesystem_and_lakescores_own():
    full = OSError(errno.ENOSPC, "No space left on device", "/data/reports/run.json")
    assert one_line(full) == "no space left on device writing /data/reports/run.json"
    read_only = OSError(errno.EROFS, "Read-only file system")
    assert (
        one_line(read_only, "publish") == "read-only file system during publish"
    )  # the step the clock says it stopped
    missing = FileNotFoundError(errno.ENOENT, "No such file or directory", "/data/x")
    assert (
        failure_reason(missing) is None
        and one_line(missing) == "FileNotFoundError: [Errno 2] No such file or directory: '/data/x'"
    )
    try:  # lakescore's own refusal says it all, whatever it was raised from
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as cause:
            raise TableError("cannot write output '/data/out': no space left on device") from cause
    except TableError as own:
        assert (
            failure_reason(own) is None and one_line(own) == "cannot write output '/data/out': no space left on device"
        )
        assert cause_chain(own) == [
            "cannot write output '/data/out': no space left on device",
            "[Errno 28] No space left on device",
        ]


def test_an_error_from_a_jvm_that_stopped_is_still_one_line():
    # py4j's error asks its JVM for its text; here the JVM's port is closed, as after the JVM died out of memory
    import socket
    from types import SimpleNamespace

    from py4j.java_gateway import GatewayClient
    from py4j.protocol import Py4JJavaError

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    exc = Py4JJavaError(
        "An error occurred while calling o42.collectToPython.\n",
        SimpleNamespace(_target_id="o7", _gateway_client=GatewayClient(port=port)),
    )
    line = one_line(exc)
    assert line.startswith("Py4JJavaError: Spark's JVM stopped before it could say why") and "driver's log" in line
    assert "\n" not in line
