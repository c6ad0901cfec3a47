"""The Nexmark harness: the span of a run, and its broker's group join delay."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

from benchmarks import broker
from benchmarks.nexmark.harness import Harness

ROOT = Path(__file__).resolve().parents[2]

#: (time, committed input, output size, process CPU s, broker CPU s), every 1 s
SAMPLES = [
    (100.0, 0, 0, 0.0, 0.0),
    (101.0, 1_000, 0, 1.0, 0.0),
    (102.0, 1_000, 10, 1.5, 0.0),
    (103.0, 2_000, 20, 2.0, 0.0),
    (104.0, 6_000, 40, 4.0, 0.0),
    (105.0, 10_000, 50, 6.0, 0.0),
]


def _figures() -> dict[str, object]:
    fake = SimpleNamespace(input_records=10_000, broker_idle=None, broker_pid=None)
    return Harness._figures(fake, SAMPLES, 100.0)  # type: ignore[arg-type]


def test_the_span_starts_at_the_first_committed_input() -> None:
    fig = _figures()
    assert fig["span_s"] == 4.0 and fig["events_in_span"] == 9_000
    assert fig["rate"] == 2_250 and fig["cpu_s_per_m"] == round(5.0 / 9_000 * 1e6, 2)


def test_the_harness_broker_delays_a_new_groups_first_assignment_when_asked() -> None:
    """--parallelism: the instances must all be in the group's first assignment."""
    assert broker._env(49092)["LOCKGATE_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"
    env = broker._env(49092, group_join_delay_ms=3000)
    props = subprocess.run(
        [str(ROOT / "docker" / "kafka" / "server-properties.sh"), "49092", "49093", "/tmp/x"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "group.initial.rebalance.delay.ms=3000" in props.splitlines()


def _run(query: str, system: str, rate: float, cpu: float, ok: bool = True) -> dict[str, object]:
    return {
        "query": query,
        "system": system,
        "tag": f"x-{query}-{system[:2]}",
        "status": "ok" if ok else "late group: formed 1.0 s after the first committed input",
        "check": "same",
        "ok": ok,
        "rate": rate,
        "cpu_s_per_m": cpu,
        "peak_rss_mb": 200.0,
        "broker_cpu_s_per_m": 0.5,
        "startup_s": 1.5,
        "span_s": 8.0,
        "load_before": 1.0,
        "load_after": 1.2,
        "outputs": 10,
        "wall_s": 12.0,
        "readback_s": 1.0,
    }


def _step_results() -> dict[str, object]:
    p1 = [
        *(
            _run("q1", "lockgate", r, c)
            for r, c in ((200_000, 3.1), (240_000, 2.9), (220_000, 3.0))
        ),
        *(_run("q1", "flink", r, c) for r, c in ((100_000, 8.0), (110_000, 7.5), (120_000, 7.0))),
        _run("q5", "lockgate", 100_000, 9.0),
        _run("q5", "flink", 200_000, 7.0),
    ]
    p2 = [
        _run("q1", "lockgate", 300_000, 3.5),
        _run("q1", "lockgate", 900_000, 1.0, ok=False),  # a late group: does not count
        _run("q1", "flink", 150_000, 9.0),
    ]
    return {
        "queries": ["q1", "q5"],
        "systems": ["lockgate", "flink"],
        "repeat": 3,
        "step_minutes": 24.5,
        "by_parallelism": {
            "1": {"runs": p1, "errors": [], "repeat": 3, "parallelism": 1, "minutes": 12.0},
            "2": {"runs": p2, "errors": [], "repeat": 1, "parallelism": 2, "minutes": 12.5},
        },
        "errors": [],
    }


def test_the_step_section_has_one_comparison_table_per_parallelism() -> None:
    from benchmarks.nexmark.step import markdown_section

    lines = markdown_section(_step_results())
    text = "\n".join(lines)
    assert "(24.5 min)" in lines[2] and "at parallelism 1, 2" in lines[2]
    p1, p2 = lines.index("### Parallelism 1"), lines.index("### Parallelism 2")
    assert p1 < p2
    first, second = lines[p1:p2], lines[p2:]
    # ratio of the medians 220k / 110k, range 200k / 120k to 240k / 100k; CPU both sides
    q1 = next(x for x in first if x.startswith("| q1 currency conversion | 2.00×"))
    assert q1 == (
        "| q1 currency conversion | 2.00× (1.67–2.40) | 220,000 (200,000–240,000) | "
        "110,000 (100,000–120,000) | 3.0 (2.9–3.1) | 7.5 (7.0–8.0) | yes |"
    )
    assert any(x.startswith("| q5 hot items (10 s hop windows, 2 s slide) | 0.50× ") for x in first)
    assert any(x.endswith("| 9.0 | 7.0 | no |") for x in first)
    # parallelism 2: the late-group run is left out of the comparison
    q1_p2 = [x for x in second if x.startswith("| q1 currency conversion | ")]
    assert q1_p2[0] == (
        "| q1 currency conversion | 2.00× (2.00–2.00) | 300,000 | 150,000 | 3.5 | 9.0 | yes |"
    )
    assert not any(x.startswith("| q5 ") for x in second)
    # each half keeps the harness's full table (runs ok: 1 of 2 lockgate runs at p2)
    assert text.count("| query | system | runs ok |") == 2
    assert "| q1 currency conversion | lockgate | 1/2 |" in text


def test_results_of_the_older_step_render_as_parallelism_1() -> None:
    from benchmarks.nexmark.step import markdown_section

    old = _step_results()["by_parallelism"]["1"]  # type: ignore[index]
    lines = markdown_section({**old, "queries": ["q1"], "systems": ["lockgate", "flink"]})
    assert "### Parallelism 1" in lines and "### Parallelism 2" not in lines
    assert any(x.startswith("| q1 currency conversion | 2.00× (1.67–2.40) |") for x in lines)


def test_a_group_counts_as_late_only_against_its_own_first_commit() -> None:
    """q7 at parallelism 2: the second app's group forms after the first app's first
    commit (it reads what the first app wrote): that run counts."""
    from benchmarks.nexmark.harness import late_group

    groups = ["g-a", "g-b"]
    formed = {"g-a": 5.0, "g-b": 6.2}
    assert late_group(groups, formed, {"g-a": 5.9, "g-b": 7.0}, 2) is None
    late = late_group(groups, formed, {"g-a": 5.9, "g-b": 6.0}, 2)
    assert late is not None and late.startswith("late group: g-b formed 0.2 s after")
    assert late_group(groups, formed, {"g-a": 4.0}, 2).startswith("late group: g-a ")  # type: ignore[union-attr]
    never = late_group(groups, {"g-a": 5.0}, {"g-a": 5.9}, 2)
    assert never == "late group: g-b never formed with 2 members"
