"""W4E's CPU split: the server apart from the peers, as an endpoint runs on hosts of its own."""

from bench.endpoint_generation import _pinned, split_cpus


def test_server_takes_the_first_half_of_the_cpus_and_the_peers_the_rest():
    assert split_cpus({0, 1}) == ({0}, {1})
    assert split_cpus({3, 1, 7, 5, 2}) == ({1, 2}, {3, 5, 7})


def test_a_single_cpu_is_shared_and_nothing_is_pinned():
    assert split_cpus({4}) == (None, None)
    assert _pinned(["lakescore", "score"], None) == ["lakescore", "score"]


def test_a_pinned_command_runs_under_taskset_on_its_cpus():
    assert _pinned(["python", "-m", "x"], {3, 1}) == ["taskset", "-c", "1,3", "python", "-m", "x"]
