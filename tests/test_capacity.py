"""The capacity planner: its arithmetic, the model against an item-by-item simulation,
measured rates recorded by workers, and the ``plan-capacity`` command.

12,000 items at 20/s per worker is 10 workers of nominal demand when they become
eligible in one minute (200/s); in five minutes the demand is 40/s (2 workers).
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable

import pytest
from typer.testing import CliRunner, Result

from redis_lease import Item, LeaseStore
from redis_lease.cli import app
from redis_lease.errors import InvalidInput, NotFound
from redis_lease.fleet.capacity.model import parse_rate, peak_age, plan, workers_needed
from redis_lease.fleet.capacity.run_capacity import (
    capacity_key,
    measured,
    record_pass,
    retry_rate,
    run_need,
)
from redis_lease.fleet.jobs.job import JobOptions
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.limits import DEFAULT_RETENTION_DAYS

runner = CliRunner()


def test_nominal_demand_is_arrivals_over_one_workers_rate() -> None:
    per_minute = plan(12_000, 60, 20, 600, retry_rate=0.05, spare_nodes=1)
    steps = dict(per_minute.steps)
    assert steps["nominal demand"] == "12,000 items / 60.0s = 200/s"
    assert per_minute.nominal_workers == 10
    assert "= 10 (keeps up" in steps["nominal workers"]
    five_minutes = plan(12_000, 300, 20, 600, retry_rate=0.05, spare_nodes=1)
    assert dict(five_minutes.steps)["nominal demand"] == "12,000 items / 300s (5.0m) = 40/s"
    assert five_minutes.nominal_workers == 2


def test_the_slo_answer_is_the_smallest_count_holding_it() -> None:
    # 12,000 in 60 s, 20/s per worker, 5% retries (1/0.95 attempts), SLO 60 s:
    # 5 workers finish 95/s: 12,000/95 - 60 + 0.05 = 66.4 s, over;
    # 6 workers finish 114/s: 12,000/114 - 60 + 0.05 = 45.3 s, within.
    result = plan(12_000, 60, 20, 60, retry_rate=0.05)
    assert (result.workers_for_slo, result.workers, result.nominal_workers) == (6, 6, 10)
    assert peak_age(12_000, 60, 5, 20, retry_rate=0.05) == pytest.approx(12_000 / 95 - 60 + 0.05)
    assert peak_age(12_000, 60, 6, 20, retry_rate=0.05) == pytest.approx(12_000 / 114 - 60 + 0.05)
    labels = [label for label, _ in result.steps]
    assert labels == [
        "nominal demand",
        "nominal workers",
        "retry headroom",
        "burst at 5 workers",
        "burst at 6 workers",
        "workers for the SLO",
        "spare",
        "workers",
    ]
    steps = dict(result.steps)
    assert "66.4s (over the SLO 60.0s)" in steps["burst at 5 workers"]
    assert "45.3s (within the SLO 60.0s)" in steps["burst at 6 workers"]
    assert steps["retry headroom"] == "1 / (1 - 0.05) = 1.0526 attempts per item"


def test_spares_are_nodes_times_their_workers() -> None:
    result = plan(12_000, 60, 20, 60, retry_rate=0.05, spare_nodes=2, workers_per_node=3)
    assert (result.workers_for_slo, result.workers) == (6, 12)
    assert dict(result.steps)["workers"] == "6 + 6 = 12"
    assert result.to_dict()["steps"][0] == {
        "label": "nominal demand",
        "arithmetic": "12,000 items / 60.0s = 200/s",
    }


def test_concurrency_multiplies_the_slot_rate() -> None:
    one_slot = plan(12_000, 60, 5, 60)
    four_slots = plan(12_000, 60, 5, 60, concurrency=4)
    assert dict(four_slots.steps)["per-worker rate"] == "4 slots x 5/s = 20/s"
    assert four_slots.nominal_workers == 10
    assert one_slot.nominal_workers == 40
    # 4 slots of 5/s finish as fast as one of 20/s, but each handler call is 0.2 s, not 0.05 s.
    assert peak_age(12_000, 60, 6, 5, concurrency=4) == pytest.approx(12_000 / 120 - 60 + 0.2)


def _simulated_finish_age(
    eligible: int, window: float, slots: int, rate: float, attempts: int
) -> float:
    """The worst eligible-to-finish age of FIFO items on ``slots`` handler slots."""
    free = [0.0] * slots
    worst = 0.0
    for n in range(eligible):
        arrive = n * window / eligible
        start = max(arrive, heapq.heappop(free))
        end = start + attempts / rate
        heapq.heappush(free, end)
        worst = max(worst, end - arrive)
    return worst


@pytest.mark.parametrize(
    ("eligible", "window", "workers", "rate", "concurrency"),
    [
        (12_000, 60, 5, 20, 1),
        (12_000, 300, 2, 20, 1),
        (12_000, 300, 3, 20, 1),
        (1_000, 10, 1, 50, 4),
        (5_000, 100, 3, 10, 2),
        (5_000, 100, 30, 10, 2),
    ],
)
@pytest.mark.parametrize("attempts", [1, 2])
def test_peak_age_agrees_with_an_item_by_item_simulation(
    eligible: int, window: float, workers: int, rate: float, concurrency: int, attempts: int
) -> None:
    predicted = peak_age(
        eligible,
        window,
        workers,
        rate,
        retry_rate=1 - 1 / attempts,
        concurrency=concurrency,
    )
    simulated = _simulated_finish_age(eligible, window, workers * concurrency, rate, attempts)
    assert abs(simulated - predicted) <= attempts / rate + 1e-9, (simulated, predicted)


@pytest.mark.parametrize(
    ("eligible", "window", "rate", "slo", "retries", "concurrency"),
    [(12_000, 300, 20, 600, 0.05, 1), (7_777, 45, 3.5, 20, 0.3, 3), (10, 1, 1, 1, 0, 1)],
)
def test_the_slo_count_is_minimal(
    eligible: int, window: float, rate: float, slo: float, retries: float, concurrency: int
) -> None:
    result = plan(eligible, window, rate, slo, retry_rate=retries, concurrency=concurrency)
    k = result.workers_for_slo

    def age(workers: int) -> float:
        return peak_age(
            eligible, window, workers, rate, retry_rate=retries, concurrency=concurrency
        )

    assert age(k) <= slo
    assert k == 1 or age(k - 1) > slo


def test_workers_needed_finishes_the_rest_by_the_deadline() -> None:
    # 38 items, 1.5 attempts each, 0.02/s per worker, 1,770 s left: 57 / 35.4 = 1.61 -> 2.
    assert workers_needed(38, 1770, 0.02, retry_rate=1 / 3) == 2
    assert workers_needed(38, 1770, 0.02, retry_rate=1 / 3, spare_nodes=1, workers_per_node=2) == 4
    assert workers_needed(0, 1770, 0.02, spare_nodes=1) == 0
    assert workers_needed(400, 10, 4) == 10  # exactly 10, not 11 from float noise
    with pytest.raises(InvalidInput, match="seconds left must be a number above 0"):
        workers_needed(1, 0, 1)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: plan(0, 60, 20, 60), "eligible items must be a whole number of at least 1"),
        (lambda: plan(10, 60, 20, 60, retry_rate=1.0), "retry rate must be from 0 to 0.99"),
        (lambda: plan(10, 60, 20, 0.01), "shorter than one handler duration"),
        (lambda: plan(10, 60, -1, 60), "per-worker rate must be a number above 0"),
        (lambda: plan(10, math.inf, 20, 60), "window must be finite"),
        (lambda: plan(10, 60, 20, 60, spare_nodes=-1), "spare nodes must be a whole number"),
        (lambda: parse_rate("20"), "invalid rate '20'"),
        (lambda: parse_rate("0/s"), "invalid rate '0/s'"),
    ],
)
def test_bad_figures_are_refused_with_the_fix(call: Callable[[], object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        call()


def test_rates_per_second_minute_and_hour() -> None:
    assert parse_rate("20/s") == 20
    assert parse_rate("1200/m") == 20
    assert parse_rate(" 72000 / h ") == 20
    assert parse_rate("0.5/s") == 0.5


def test_retry_rate_is_the_share_of_ended_attempts_that_finished_nothing() -> None:
    # 10 claims, 2 still held: 8 ended; 6 items done or dead: 2 of 8 finished nothing.
    assert retry_rate({"claims": 10}, {"leased": 2, "done": 5, "dead": 1}) == 0.25
    assert retry_rate({}, {"done": 0}) == 0.0
    # 2 more claims given back unstarted (a drain): not attempts that finished nothing
    assert retry_rate({"claims": 12, "releases": 2}, {"leased": 2, "done": 5, "dead": 1}) == 0.25


# -- measured rates (recorded by workers) ---------------------------------------


def test_recorded_passes_add_up(store: LeaseStore) -> None:
    store.add("cap", [Item(f"i{n}") for n in range(4)], shards=2)
    assert measured(store, "cap") is None  # nothing recorded: unknown, not zero
    for name in ("i0", "i1", "i2"):
        store.commit(store.claim("cap", name, "w"))
    store.fail(store.claim("cap", "i3", "w"), "boom")  # retried: 1 of 4 attempts finished nothing
    record_pass(store, "cap", handled=3, handler_seconds=1.5, busy_seconds=1.0)
    record_pass(store, "cap", handled=1, handler_seconds=0.5, busy_seconds=1.0)
    got = measured(store, "cap")
    assert got is not None
    assert (got.passes, got.handled) == (2, 4)
    assert got.per_worker == pytest.approx(2.0)
    assert got.handler_duration == pytest.approx(0.5)
    assert got.concurrency == pytest.approx(1.0)
    assert got.retry_rate == pytest.approx(0.25)
    assert capacity_key(store, "cap") == store.keys.run("cap") + ":capacity"


def test_a_finished_runs_measurements_expire_with_the_run(store: LeaseStore) -> None:
    store.add("cap", [Item("i0")], shards=1)
    record_pass(store, "cap", handled=1, handler_seconds=0.1, busy_seconds=0.1)
    key = capacity_key(store, "cap")
    assert store.client.pttl(key) == -1
    Runs(store).finalize("cap", "test")
    assert 0 < store.client.pttl(key) <= DEFAULT_RETENTION_DAYS * 86_400_000


def test_measured_of_a_missing_run_is_not_found(store: LeaseStore) -> None:
    with pytest.raises(NotFound):
        measured(store, "nowhere")


def test_run_need_says_unknown_rather_than_inventing_a_number(store: LeaseStore) -> None:
    store.add("need", [Item("a")], shards=1)
    assert run_need(None, 5, 100).workers is None
    assert "no worker has recorded a pass" in run_need(None, 5, 100).basis
    assert run_need(None, 5, None).basis == "unknown: the run has no deadline"
    assert run_need(None, 0, 100).workers == 0
    record_pass(store, "need", handled=10, handler_seconds=10, busy_seconds=10)
    known = run_need(measured(store, "need"), 50, 10, spare_nodes=1)
    assert known.workers == 6  # ceil(50 / (1/s x 10 s)) + 1
    assert known.basis.endswith("+ 1 spare = 6")


# -- the command ----------------------------------------------------------------


def _cli(*args: str) -> Result:
    return runner.invoke(app, ["plan-capacity", *args], env={"REDIS_LEASE_DEBUG": None})


SEED = ["--eligible", "12000", "--per-worker", "20/s", "--retry-rate", "0.05", "--spare-nodes", "1"]


def test_the_command_prints_the_arithmetic() -> None:
    result = _cli(*SEED, "--window", "1m", "--slo", "1m")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("12,000 items / 60.0s = 200/s", "ceil(200/s / 20/s) = 10", "6 + 1 = 7"):
        assert text in " ".join(out.split()), out
    assert out.rstrip().splitlines()[-1].startswith("workers: 7 (6 hold the SLO, nominal 10)")


def test_the_command_prints_json() -> None:
    result = _cli(*SEED, "--window", "5m", "--slo", "10m", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    expected = plan(12_000, 300, 20, 600, retry_rate=0.05, spare_nodes=1).to_dict()
    assert data == expected
    assert (data["workers"], data["workers_for_slo"], data["nominal_workers"]) == (2, 1, 2)


def test_handler_duration_and_concurrency_give_the_rate() -> None:
    result = _cli(
        "--eligible", "12000", "--window", "1m", "--slo", "1m", "--handler", "0.2s",
        "--concurrency", "4", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == plan(12_000, 60, 5, 60, concurrency=4).to_dict()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--window", "5x", "--slo", "10m", "--per-worker", "20/s"], "invalid duration '5x'"),
        (["--window", "0s", "--slo", "10m", "--per-worker", "20/s"], "window '0s' must be above 0"),
        (["--window", "5m", "--slo", "10m", "--per-worker", "20"], "invalid rate '20'"),
        (["--window", "5m", "--slo", "10m"], "give --per-worker"),
        (
            ["--window", "5m", "--slo", "10m", "--per-worker", "20/s", "--handler", "1s"],
            "not both",
        ),
        (
            ["--window", "5m", "--slo", "10m", "--per-worker", "20/s", "--retry-rate", "1"],
            "retry rate must be from 0 to 0.99",
        ),
        (
            ["--window", "5m", "--slo", "10m", "--per-worker", "20/s", "--spare-nodes", "-1"],
            "--spare-nodes",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = _cli("--eligible", "12000", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert result.stdout == ""


def test_from_run_takes_the_measured_rates(real_store: LeaseStore, redis_url: str) -> None:
    store = real_store
    store.add("measured", [Item(f"i{n}") for n in range(5)], shards=1)
    for name in ("i0", "i1", "i2", "i3"):
        store.commit(store.claim("measured", name, "w"))
    store.fail(store.claim("measured", "i4", "w"), "boom")  # 1 of 5 attempts finished nothing
    # Two slots busy on average; 40 items per 4 worker-seconds: 10/s per worker, 5/s a slot.
    record_pass(store, "measured", handled=40, handler_seconds=8.0, busy_seconds=4.0)
    base = ["--url", redis_url, "--prefix", store.prefix, "plan-capacity", "--eligible", "12000"]
    args = [*base, "--window", "1m", "--slo", "1m", "--from-run", "measured", "--json"]
    result = runner.invoke(app, args, env={"REDIS_LEASE_DEBUG": None})
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["measured"]["run"] == "measured"
    assert data["measured"]["per_worker"] == pytest.approx(10.0)
    assert data["measured"]["retry_rate"] == pytest.approx(0.2)
    expected = plan(12_000, 60, 5.0, 60, retry_rate=0.2, concurrency=2).to_dict()
    assert {k: data[k] for k in expected} == expected
    # Explicit figures win over measured ones.
    result = runner.invoke(app, [*args, "--retry-rate", "0"], env={"REDIS_LEASE_DEBUG": None})
    assert json.loads(result.stdout)["workers"] == plan(12_000, 60, 5.0, 60, concurrency=2).workers
    # Another slot count: each slot at the measured handler pace (0.2 s: 5/s), not the
    # measured worker rate spread thinner.
    result = runner.invoke(app, [*args, "--concurrency", "4"], env={"REDIS_LEASE_DEBUG": None})
    expected = plan(12_000, 60, 5.0, 60, retry_rate=0.2, concurrency=4).to_dict()
    assert {k: json.loads(result.stdout)[k] for k in expected} == expected

    unmeasured = runner.invoke(
        app, [*base, "--window", "1m", "--slo", "1m", "--from-run", "nowhere"]
    )
    assert unmeasured.exit_code == 5, unmeasured.output
    store.add("fresh", [Item("x")], shards=1)
    fresh = runner.invoke(app, [*base, "--window", "1m", "--slo", "1m", "--from-run", "fresh"])
    assert fresh.exit_code == 2, fresh.output
    assert "has no recorded worker passes: give --per-worker" in fresh.stderr


@pytest.mark.parametrize(
    ("field", "value"), [("spare_nodes", -1), ("spare_nodes", 1001), ("workers_per_node", 0)]
)
def test_headroom_options_out_of_bounds_are_refused(field: str, value: int) -> None:
    with pytest.raises(InvalidInput, match=field):
        JobOptions(**{field: value})
