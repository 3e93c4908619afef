"""``resources.scoring``: config validation and the pure profile decision (no SparkContext needed)."""

import pytest

from lakescore.jobs.config import ConfigError, ScoringResources, load_config
from lakescore.jobs.platform.spark.profiles import ProfileError, build_profile, plan_profile, supports_profiles

GPU_EXECUTORS = {"spark.executor.resource.gpu.amount": "1"}
DYNAMIC = {"spark.dynamicAllocation.enabled": "true"}


def resources(**keys) -> ScoringResources:
    return load_config(flags={f"resources.scoring.{k}": v for k, v in keys.items()}).resources.scoring


def test_keys_load_from_yaml(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "resources:\n  scoring:\n    task_cpus: 2\n    task_gpus: 0.5\n    executor_gpus: 1\n"
        "    executor_memory_overhead: 2g\n    partitions: 16\n    discovery_script: /opt/spark/getGpus.sh\n"
    )
    got = load_config(path).resources.scoring
    assert got == ScoringResources(
        task_cpus=2,
        task_gpus=0.5,
        executor_gpus=1,
        executor_memory_overhead="2g",
        partitions=16,
        discovery_script="/opt/spark/getGpus.sh",
    )
    assert got.requested
    assert not load_config().resources.scoring.requested


@pytest.mark.parametrize(
    "override, message",
    [
        ("task_gpus=0.75", r"resources.scoring.task_gpus must be at most 0.5 or a whole number, got 0.75"),
        ("task_gpus=0", r"resources.scoring.task_gpus must be > 0"),
        ("task_gpus=one", r"resources.scoring.task_gpus must be a number"),
        ("task_cpus=0", r"resources.scoring.task_cpus must be >= 1"),
        ("executor_gpus=2", r"executor_gpus needs resources.scoring.task_gpus"),
        (
            "executor_memory_overhead=lots",
            r"executor_memory_overhead must be a Spark size such as 512m or 2g, got 'lots'",
        ),
        ("partitions=0", r"resources.scoring.partitions must be >= 1"),
        (
            "discovery_script=/x.sh",
            r"discovery_script is for the profile's executor GPUs; set resources.scoring.executor_gpus",
        ),
        ("task_gpu=1", r"unknown config key 'resources.scoring.task_gpu'; did you mean 'resources.scoring.task_gpus'"),
    ],
)
def test_bad_values_fail_at_load_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[f"resources.scoring.{override}"])


def test_task_gpus_above_executor_gpus_is_refused():
    with pytest.raises(ConfigError, match=r"task_gpus \(2\) exceeds resources.scoring.executor_gpus \(1\)"):
        load_config(overrides=["resources.scoring.task_gpus=2", "resources.scoring.executor_gpus=1"])


def test_whole_gpu_counts_and_sizes_are_accepted():
    assert resources(task_gpus=2, executor_gpus=4, executor_memory_overhead=2048).executor_memory_overhead == "2048"


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "mesos://x:5050"])
def test_masters_without_profile_support_get_no_profile_and_a_warning(master):
    plan = plan_profile(resources(task_gpus=1), master, GPU_EXECUTORS)
    assert not plan.applies and build_profile(plan) is None
    assert (
        len(plan.warnings) == 1 and "cannot honour resource profiles" in plan.warnings[0] and master in plan.warnings[0]
    )


@pytest.mark.parametrize("master", ["spark://h:7077", "local-cluster[2,1,1024]", "yarn", "k8s://https://h:443"])
def test_cluster_masters_support_profiles(master):
    assert supports_profiles(master)


def test_nothing_configured_means_the_default_profile_silently():
    plan = plan_profile(ScoringResources(), "local[2]", {})
    assert not plan.applies and plan.warnings == ()


def test_dynamic_allocation_gets_executor_and_task_requests():
    res = resources(
        task_cpus=2, task_gpus=1, executor_gpus=2, executor_memory_overhead="2g", discovery_script="/gpus.sh"
    )
    plan = plan_profile(res, "spark://h:7077", DYNAMIC)
    assert plan.warnings == ()
    profile = build_profile(plan)
    assert {k: r.amount for k, r in profile.taskResources.items()} == {"cpus": 2, "gpu": 1.0}
    executor = profile.executorResources
    assert executor["gpu"].amount == 2 and executor["gpu"].discoveryScript == "/gpus.sh"
    assert executor["memoryOverhead"].amount == 2048  # MiB


def test_dynamic_allocation_with_task_gpus_needs_executor_gpus():
    with pytest.raises(ProfileError, match="set resources.scoring.executor_gpus"):
        plan_profile(resources(task_gpus=1), "yarn", DYNAMIC)


def test_static_executors_get_a_task_only_profile_and_executor_requests_are_reported():
    res = resources(task_cpus=1, task_gpus=0.5, executor_gpus=1, executor_memory_overhead="1g")
    plan = plan_profile(res, "local-cluster[2,1,1024]", GPU_EXECUTORS)
    profile = build_profile(plan)
    assert {k: r.amount for k, r in profile.taskResources.items()} == {"cpus": 1, "gpu": 0.5}
    assert profile.executorResources == {}
    assert len(plan.warnings) == 1 and "['gpu', 'memory_overhead']" in plan.warnings[0]


def test_static_executors_without_gpus_cannot_run_gpu_tasks():
    with pytest.raises(
        ProfileError, match=r"spark.executor.resource.gpu.amount=unset: no scoring task could ever be scheduled"
    ):
        plan_profile(resources(task_gpus=1), "spark://h:7077", {})
    with pytest.raises(ProfileError, match=r"amount=1"):
        plan_profile(resources(task_gpus=2), "spark://h:7077", GPU_EXECUTORS)


def test_static_executors_with_only_executor_requests_keep_the_default_profile():
    plan = plan_profile(resources(executor_memory_overhead="2g"), "spark://h:7077", {})
    assert not plan.applies and "ignored per-stage executor request(s) ['memory_overhead']" in plan.warnings[0]
