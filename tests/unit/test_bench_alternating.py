"""The two-peer bench runner (W4, W5) over real processes: each run's measurement, report, rate and medians."""

import sys
from pathlib import Path

from bench.alternating import PeerRuns, compare_first_good, first_good, run_alternately

_WRITE = "import json, sys; json.dump({'done': int(sys.argv[2])}, open(sys.argv[1] + '/out.json', 'w'))"


class Runs(PeerRuns):
    def __init__(self, runs):
        self.runs = runs


def test_peers_alternate_and_a_failed_run_is_kept_apart(tmp_path, capsys):
    commands = {
        "fast": lambda run_dir: [sys.executable, "-c", _WRITE, str(run_dir), "10"],
        "broken": lambda run_dir: [sys.executable, "-c", "raise SystemExit(3)"],
    }
    runs = run_alternately(
        "WX",
        commands,
        {"fast": "out.json", "broken": "out.json"},
        lambda report: report["done"] / 2,
        lambda peer, rate: f"{rate} a second",
        tmp_path,
        {},
        {"fast": {"A": "1"}},
        Path.cwd(),
        2,
    )
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[WX")]
    assert [line.split("]")[0] for line in lines] == [
        "[WX fast 1/2",
        "[WX broken 1/2",
        "[WX fast 2/2",
        "[WX broken 2/2",
    ]
    assert lines[0].endswith("5.0 a second") and "FAILED (exit 3" in lines[1]
    result = Runs(runs)
    assert [r.rate for r in runs["fast"]] == [5.0, 5.0] and result.median("fast", "rate") == 5.0
    assert result.median("fast", "wall") > 0 and result.median("broken", "wall") is None and not result.ok
    assert (
        first_good(tmp_path, "WX", runs, "fast") == tmp_path / "WX-fast-1"
        and first_good(tmp_path, "WX", runs, "broken") is None
    )
    assert result.peer_line("WX", "fast", "things/s", 1).startswith("WX fast: whole process median ")
    assert "things/s median 5.0 (min 5.0, max 5.0) over 2 run(s)" in result.peer_line("WX", "fast", "things/s", 1)
    assert (
        result.peer_line("WX", "broken", "things/s", 1) == "WX broken: FAILED"
        and result.peer_line("WX", "none", "", 1) is None
    )
    both = Runs({"lakescore": runs["fast"], "loop": runs["fast"]})
    assert both.whole_line("WX", "loop", "loop's", 1.0).startswith(
        "WX whole process, loop's wall time over lakescore's: "
    )
    assert both.whole_line("WX", "loop", "loop's", 1.0).endswith("= 1.00x   target >= 1x: met")
    assert Runs({"lakescore": runs["fast"], "loop": runs["broken"]}).whole_line("WX", "loop", "loop's", 1.0) is None
    # The outputs compared are the first good runs' of both peers; a peer with none, or a failing comparison, gives
    # None.
    seen = compare_first_good(
        tmp_path,
        "WX",
        {"fast": runs["fast"], "again": runs["fast"]},
        {"fast": "out.json", "again": "out.json"},
        lambda ours, theirs: {"paths": (ours, theirs)},
    )
    assert seen == {"paths": (tmp_path / "WX-fast-1" / "out.json", tmp_path / "WX-again-1" / "out.json")}
    assert compare_first_good(tmp_path, "WX", runs, {"fast": "out.json", "broken": "out.json"}, lambda *_: {}) is None
    assert (
        compare_first_good(
            tmp_path,
            "WX",
            {"fast": runs["fast"], "b": runs["fast"]},
            {"fast": "x", "b": "y"},
            lambda ours, theirs: ours.read_text(),
        )
        is None
        and "WX output comparison failed" in capsys.readouterr().out
    )
