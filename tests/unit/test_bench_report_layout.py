"""BENCHMARKS.md's layout as ``make bench`` writes it (pure text, no runs): the hand-kept current figures stay on the
first screen, a run replaces only its own part, and the hand-written tail survives."""

from pathlib import Path

from bench.run import CURRENT_SECTION, KEPT_SECTIONS, RUN_SECTION, compose

REPO = Path(__file__).resolve().parents[2]


def _run(text: str) -> str:
    return f"# lakescore benchmarks\n\nintro\n\n{RUN_SECTION}\n\n## Machine\n\n{text}\n\n## Targets\n\n- t\n"


def test_a_run_keeps_the_current_figures_above_it_and_the_tail_below():
    previous = compose(_run("old run"), "")
    previous = previous.replace(RUN_SECTION, f"{CURRENT_SECTION}\n\n| W1 | 0.81x |\n\n{RUN_SECTION}")
    previous += f"\n{KEPT_SECTIONS}\n\nkept\n\n## History\n\nrows\n"

    after = compose(_run("new run"), previous)

    assert "old run" not in after and "new run" in after
    assert after.index(CURRENT_SECTION) < after.index("| W1 | 0.81x |") < after.index(RUN_SECTION)
    assert after.index(RUN_SECTION) < after.index(KEPT_SECTIONS) < after.index("## History")
    assert after.count(CURRENT_SECTION) == 1 and after.count(KEPT_SECTIONS) == 1 and after.endswith("rows\n")
    assert compose(_run("new run"), after) == after


def test_benchmarks_md_is_in_the_layout_the_generator_writes():
    """The committed page is what a run would leave: its current figures first, then a run's part, then the tail."""
    text = (REPO / "BENCHMARKS.md").read_text()
    current, run, kept = (text.index(h) for h in (CURRENT_SECTION, RUN_SECTION, KEPT_SECTIONS))
    assert current < run < kept
    document = text[:current] + text[run:kept].rstrip("\n") + "\n"
    assert compose(document, text) == text
