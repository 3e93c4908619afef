"""The Java options a local driver (and a ``local-cluster``'s JVMs) get: the decision, and that the JVM on this host
accepts them."""

import shutil
import subprocess

import pytest

from lakescore.jobs.platform.spark.local.own_host import (
    C1_ONLY_JAVA_OPTIONS,
    LOCAL_MODE_JAVA_OPTIONS,
    local_java_options,
    one_host_cluster_java_options,
)


@pytest.mark.parametrize(
    "driver_memory, user_options, serial",
    [
        ("1g", "", True),  # Spark's default driver heap
        ("4g", "-Dfoo=bar", True),
        ("4096m", "", True),
        ("4097m", "", False),
        ("8g", "", False),
        ("2048", "", True),  # a bare number is MiB
        ("1G", "-XX:+UseG1GC -Xlog:gc", False),  # the user's collector wins; the JVM refuses two
        ("1g", "-XX:+UseParallelGC", False),
        ("1g", "-XX:-UseAdaptiveSizePolicy", True),  # not a collector choice
        ("lots", "", False),  # not a size: Spark reports it; nothing added
    ],
)
def test_serial_collector_only_for_small_heaps_the_user_left_alone(driver_memory, user_options, serial):
    options = local_java_options(driver_memory, user_options)
    assert options[0] == LOCAL_MODE_JAVA_OPTIONS
    assert ("-XX:+UseSerialGC" in options) is serial


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")
@pytest.mark.parametrize("user_options", ["", "-XX:+UseG1GC"])
def test_the_jvm_starts_with_the_options_and_the_users_collector(user_options):
    options = [*local_java_options("1g", user_options), *user_options.split()]
    command = ["java", *options, "-Xlog:gc:stdout", "-XX:+PrintFlagsFinal", "-version"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert ("Using G1" if user_options else "Using Serial") in result.stdout
    flags = {line.split()[1]: line.split()[3] for line in result.stdout.splitlines() if line.count("=") == 1}
    # C1-only, with the tiered JVM's code cache rather than a client VM's 48 MiB, which a long session fills
    assert (flags["TieredStopAtLevel"], flags["ReservedCodeCacheSize"]) == ("1", str(240 * 2**20))


@pytest.mark.parametrize(
    "master, c1_only",
    [
        ("local-cluster[2,1,1024]", True),  # Spark's one-host test cluster: driver and executors share this host
        ("local[2]", False),  # a local driver gets local_java_options instead
        ("spark://host:7077", False),
        ("yarn", False),
        ("k8s://https://api:443", False),
    ],
)
def test_only_a_one_host_cluster_runs_every_jvm_c1_only(master, c1_only):
    assert one_host_cluster_java_options(master) == (list(C1_ONLY_JAVA_OPTIONS) if c1_only else [])


@pytest.mark.parametrize("master", ["spark://127.0.0.1:7077", "yarn", "k8s://https://10.0.0.1:443", "mesos://h:5050"])
def test_a_cluster_master_gets_no_acceleration_at_all(master, tmp_path):
    """No JVM flag, class archive, Delta default, daemon or quiet gateway reaches a cluster lakescore does not own,
    even with an archive on disk and both keys on (their defaults)."""
    from lakescore.jobs.config import SparkConfig
    from lakescore.jobs.platform.spark.local.own_host import OwnHostTuning, own_host_tuning

    cfg = SparkConfig(master=master, jars_dir=str(tmp_path), class_archive=True, worker_preload=True)
    assert own_host_tuning(cfg, {}, ("torch",)) == OwnHostTuning()


@pytest.mark.parametrize("master, local", [("local[2]", True), ("local", True), ("local-cluster[2,1,1024]", False)])
def test_this_hosts_own_masters_get_the_jvm_flags_and_the_daemon(master, local):
    from lakescore.jobs.config import SparkConfig
    from lakescore.jobs.platform.spark.local.own_host import OWN_HOST_DEFAULTS, own_host_tuning

    fast = own_host_tuning(SparkConfig(master=master, class_archive=False), {}, ("torch",))
    assert LOCAL_MODE_JAVA_OPTIONS in fast.driver_java_options and fast.quiet_gateway
    assert "spark.python.daemon.module" in fast.confs
    assert fast.defaults == OWN_HOST_DEFAULTS
    assert fast.executor_java_options == ([] if local else list(C1_ONLY_JAVA_OPTIONS))
