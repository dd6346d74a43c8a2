"""The pure parts of benchmarks/burst.py: arrivals, the search, the table, the JSON, the plot.

Nothing here starts a worker or times anything: trials are built from synthetic samples.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.burst import parse_args, search
from benchmarks.burst_jobs import PlannedFailure, Settings, fails, make_job
from benchmarks.burst_model import Scenario, Trial, arrivals
from benchmarks.burst_planner import Answer, measured_rate, planner_at_rate, planner_view
from benchmarks.burst_report import plot, report, summary, table
from redis_lease.protocol.leases import Item

SCENARIO = Scenario(
    eligible_full=12_000,
    window_full=300.0,
    slo_full=60.0,
    scale=0.1,
    handler_ms=50.0,
    retry_rate=0.05,
    max_workers=4,
)


def trial(workers: int, peak: float, *, drained: bool = False, timed_out: bool = False) -> Trial:
    """A trial whose age rises linearly to ``peak`` at 30 s and drops to 0 when done."""
    samples = [(t * 0.25, peak * t / 120) for t in range(121)] + [(30.5, 0.0)]
    return Trial(
        workers,
        drained,
        samples,
        seconds=30.5,
        done=1200,
        claims=1263,
        retries=63,
        state="succeeded",
        drained_at=15.0 if drained else None,
        timed_out=timed_out,
    )


def measure_from(peaks: dict[int, float], calls: list[int], **kw: bool) -> Callable[[int], Trial]:
    """A stand-in for a fleet trial: the peak age for K comes from ``peaks``."""

    def measure(workers: int) -> Trial:
        calls.append(workers)
        return trial(workers, peaks[workers], **kw)

    return measure


def test_the_scenario_scales_items_window_and_slo_but_keeps_the_rate() -> None:
    assert (SCENARIO.eligible, SCENARIO.window, SCENARIO.slo) == (1200, 30.0, 6.0)
    assert SCENARIO.per_worker == 20.0
    data = SCENARIO.to_dict()
    assert data["eligible_full"] == 12_000 and data["eligible"] == 1200


def test_items_become_eligible_evenly_over_the_window() -> None:
    counts = [arrivals(t / 10, 1200, 30.0) for t in range(0, 400)]
    assert counts[0] == 0
    assert arrivals(15.0, 1200, 30.0) == 600
    assert arrivals(30.0, 1200, 30.0) == 1200
    assert arrivals(99.0, 1200, 30.0) == 1200
    assert all(b >= a for a, b in itertools.pairwise(counts))
    assert arrivals(-1.0, 1200, 30.0) == 0


def test_the_search_stops_at_the_smallest_count_that_holds() -> None:
    calls: list[int] = []
    found, trials = search(measure_from({1: 33.0, 2: 5.9, 3: 0.4, 4: 0.1}, calls), 6.0, 1, 4)
    assert found == 2
    assert calls == [1, 2]
    assert [t.workers for t in trials] == [1, 2]


def test_the_search_says_none_when_no_count_up_to_the_limit_holds() -> None:
    calls: list[int] = []
    found, trials = search(measure_from({1: 40.0, 2: 20.0, 3: 9.0}, calls), 6.0, 1, 3)
    assert found is None
    assert calls == [1, 2, 3]
    assert not any(t.holds(6.0) for t in trials)


def test_the_drained_search_measures_k_and_k_plus_one_and_goes_on_until_one_holds() -> None:
    calls: list[int] = []
    found, _ = search(measure_from({2: 1.0, 3: 0.5}, calls, drained=True), 6.0, 2, 8, at_least=3)
    assert (found, calls) == (2, [2, 3])
    calls.clear()
    found, _ = search(
        measure_from({2: 21.0, 3: 8.0, 4: 2.0, 5: 1.0}, calls, drained=True), 6.0, 2, 8, at_least=3
    )
    assert (found, calls) == (4, [2, 3, 4])


def test_a_trial_holds_only_when_it_finished_within_the_slo() -> None:
    assert trial(2, 6.0).holds(6.0)
    assert not trial(2, 6.01).holds(6.0)
    assert not trial(2, 1.0, timed_out=True).holds(6.0)
    assert trial(2, 4.0).peak == pytest.approx(4.0)
    assert trial(3, 1.0, drained=True).label == "K=3, 1 drained"
    assert trial(1, 1.0).attempts_per_item() == pytest.approx(1263 / 1200)


def test_the_answer_agrees_within_one_worker() -> None:
    assert Answer("q", 3, 4).agrees
    assert Answer("q", 3, 2).agrees
    assert not Answer("q", 3, 5).agrees
    missing = Answer("q", 3, None)
    assert not missing.agrees and missing.to_dict()["difference"] is None


def test_the_table_has_a_row_per_trial_with_the_planners_peak() -> None:
    predicted = {"1": 33.21, "2": 1.63, "3": 0.05}
    stalled = trial(2, 20.0, drained=True)
    stalled.stalled_job_seconds = 15.04
    text = table([trial(1, 33.0), trial(2, 3.5), stalled], 6.0, predicted)
    lines = text.splitlines()
    assert len(lines) == 5
    assert lines[2].startswith("| search | 1 | 33.00 | 33.21 | 6 | no |")
    assert lines[3].startswith("| search | 2 | 3.50 | 1.63 | 6 | yes |")
    assert lines[4].startswith(
        "| drained | 2, 1 drained at 15.0s | 20.00 | 33.21 (for 1) | 6 | no |"
    )
    assert lines[4].endswith("| 30.5 | 1.052 | 63 | 15.0 | succeeded |")


def test_the_summary_names_a_disagreement() -> None:
    text = summary([Answer("SLO", 2, 3), Answer("spare", 3, None)])
    assert text.splitlines() == [
        "SLO: planner 2, measured 3: agree within one worker",
        "spare: planner 3, measured none held: DISAGREE",
    ]


def test_the_json_report_has_the_scenario_the_planner_the_trials_and_the_answers() -> None:
    planner = planner_view(SCENARIO)
    answers = [Answer("SLO", 2, 2), Answer("spare", 3, 5)]
    data = report(
        SCENARIO,
        planner,
        [trial(1, 33.0), trial(2, 3.5)],
        [trial(2, 20.0, drained=True), trial(3, 2.0, drained=True)],
        answers,
        {"load_average_1m": {"start": 0.5, "end": 0.7}},
    )
    loaded = json.loads(json.dumps(data))
    assert set(loaded) >= {"scenario", "planner", "search", "drained", "answers", "agree"}
    assert loaded["agree"] is False
    assert [a["within_one"] for a in loaded["answers"]] == [True, False]
    first = loaded["search"][0]
    assert first["workers"] == 1 and first["holds"] is False and first["peak"] == 33.0
    assert first["samples"][0] == [0.0, 0.0] and len(first["samples"]) == 122
    assert loaded["drained"][0]["drained_at"] == 15.0
    assert loaded["load_average_1m"] == {"start": 0.5, "end": 0.7}


def test_the_planner_view_asks_the_planner_the_scaled_questions() -> None:
    view = planner_view(SCENARIO)
    assert view["plan"]["workers_for_slo"] == 2
    assert view["plan_one_spare"]["workers"] == view["plan"]["workers_for_slo"] + 1
    assert sorted(view["predicted_peak"]) == ["1", "2", "3", "4"]
    assert view["predicted_peak"]["1"] > SCENARIO.slo >= view["predicted_peak"]["2"]


def test_the_measured_rate_comes_from_the_one_consumer_trial() -> None:
    assert measured_rate([trial(1, 33.0), trial(2, 3.0)]) == pytest.approx(1263 / 30.5)
    assert measured_rate([trial(2, 3.0)]) is None
    assert measured_rate([trial(1, 33.0, timed_out=True)]) is None
    slower = planner_at_rate(SCENARIO, 15.0)
    assert slower["plan"]["workers_for_slo"] == 3


def test_the_plot_is_a_png_with_both_panels(tmp_path: Path) -> None:
    path = plot(
        [trial(1, 33.0), trial(2, 3.5)],
        [trial(2, 20.0, drained=True), trial(3, 2.0, drained=True)],
        SCENARIO,
        tmp_path / "out" / "burst.png",
    )
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1200, 450)
    import matplotlib

    assert matplotlib.get_backend().lower() == "agg"


def test_planned_failures_hit_about_the_retry_rate_and_do_not_depend_on_the_worker() -> None:
    ids = [f"r{n:07d}" for n in range(20_000)]
    failed = [fails(i, 1, 0.05) for i in ids]
    assert 0.045 < sum(failed) / len(ids) < 0.055
    assert failed == [fails(i, 1, 0.05) for i in ids]
    again = [fails(i, 2, 0.05) for i, f in zip(ids, failed, strict=True) if f]
    assert sum(again) < len(again) * 0.2
    assert not any(fails(i, 1, 0.0) for i in ids)


def test_the_handler_fails_exactly_the_planned_attempts() -> None:
    job = make_job(Settings(handler_ms=0.1, retry_rate=0.5))
    assert job.handle_item is not None
    item = Item("r0000001", {"n": 1})
    outcomes = []
    for attempt in range(1, 9):
        lease = SimpleNamespace(lease=SimpleNamespace(attempt=attempt))
        try:
            job.handle_item(item, lease)  # type: ignore[arg-type]
            outcomes.append(False)
        except PlannedFailure:
            outcomes.append(True)
    assert outcomes == [fails(item.id, a, 0.5) for a in range(1, 9)]
    assert True in outcomes and False in outcomes


def test_the_settings_reach_the_workers_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings(queue="burst-x-1", shards=3, handler_ms=25.0, retry_rate=0.1)
    for name, value in settings.to_env().items():
        monkeypatch.setenv(name, value)
    assert Settings.from_env() == settings
    job = make_job(Settings.from_env())
    assert (job.options.shards, job.options.queue, job.options.batch_size) == (3, "burst-x-1", 1)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--retry-rate", "0.9"], "--retry-rate must be from 0 to 0.5"),
        (["--window", "5x"], "invalid duration '5x'"),
        (["--max-workers", "40"], "--max-workers must be from 1 to 16"),
        (["--scale", "0"], "--scale must be above 0"),
        (["--eligible", "50"], "--eligible x --scale must leave at least 10 items"),
        (["--slo", "0.1s"], "the scaled SLO is shorter than one handler call"),
    ],
)
def test_bad_options_end_with_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_quick_halves_the_default_scale_and_durations_take_units() -> None:
    assert parse_args(["--quick"]).scale == 0.05
    assert parse_args([]).scale == 0.1
    args = parse_args(["--window", "5m", "--slo", "90s", "--scale", "0.2"])
    assert (args.window, args.slo, args.scale) == (300.0, 90.0, 0.2)
