"""The scheduler tick with explicit times: one run per date under concurrent ticks,
catch-up policies, deadlines ending runs partial, resume, planner errors, re-planning
after a crash, burst capacity, and the decision log.

The tick's clock is given; the shards bar claims after the run's deadline on the
server clock, so the nightly run these tests claim from is tomorrow's: its
deadline lies ahead on the server clock whatever time the tick is told it is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, date, datetime, time, timedelta
from time import monotonic
from typing import Any

import pytest

from redis_lease import Item, LeaseStore
from redis_lease.errors import InvalidInput, RunClosed
from redis_lease.fleet.capacity.run_capacity import record_pass
from redis_lease.fleet.runs.lifecycle import PLAN_BATCH, Decision, Runs, to_ms
from redis_lease.fleet.tick import missed_runs
from redis_lease.fleet.tick.backfill import backfill
from redis_lease.fleet.tick.schedule import pause, resume
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.fleet.transport.shard_job_failures import (
    FAILURE_STREAK_LIMIT,
    job_failures,
    record_job_failure,
)
from redis_lease.fleet.transport.shard_jobs import live_jobs, queue
from redis_lease.fleet.worker.shard_job import _forget_job
from redis_lease.operate.cli_printing import iso_time
from redis_lease.operate.metrics.collector import WORKERS_NEEDED, WORKERS_NEEDED_UNKNOWN
from tests import fleet_jobs
from tests.fleet_helpers import NIGHTLY_PATH, REPO, Configure, configure_nightly, text
from tests.helpers import scrape
from tests.rq_helpers import burst

#: 30 seconds after the nightly job's 02:00 start tomorrow (UTC).
DAY = datetime.now(UTC).date() + timedelta(days=1)
T0 = datetime.combine(DAY, time(2, 0, 30), UTC)
RUN = f"nightly:{DAY.isoformat()}"
MARCH_10 = "nightly:2026-03-10"


@pytest.fixture
def nightly(real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Configure]:
    """Sets the nightly job's options for this test (its own RQ queue) and its planner."""
    yield from configure_nightly(real_store, monkeypatch, items=4)


def logged_as(decision: Decision) -> tuple[str, ...]:
    """The event log entry a tick's decision is recorded as, in the form :func:`entry` gives.

    A plan is the run's state change from planning to running, with the same reason; a
    planning error's finalize is the change to failed (the decision's reason is the new
    state, a colon and the change's reason); every other decision is an event of its own
    kind with the same reason.
    """
    if decision.kind == "plan":
        return ("state", "planning", "running", decision.reason)
    state, _, reason = decision.reason.partition(": ")
    if decision.kind == "finalize" and reason.startswith("planning error: "):
        return ("state", "planning", state, reason)
    return (decision.kind, decision.reason)


def entry(event: dict[str, str]) -> tuple[str, ...]:
    """An event log entry: its kind and reason, and for a state change its two states."""
    if event["kind"] == "state":
        return ("state", event["from"], event["to"], event["reason"])
    return (event["kind"], event["reason"])


def assert_logged(runs: Runs, decisions: list[Decision]) -> None:
    """Every decision a tick returned is in its run's event log, whole: one entry each."""
    for run_id in {decision.run_id for decision in decisions}:
        logged = Counter(entry(event) for event in runs.decisions(run_id, count=1000))
        wanted = Counter(logged_as(d) for d in decisions if d.run_id == run_id)
        missing = wanted - logged
        assert not missing, (missing, logged)


def kinds(runs: Runs, run_id: str) -> list[str]:
    """The kinds of the run's events, oldest first."""
    return [e["kind"] for e in runs.decisions(run_id, count=200)]


def test_concurrent_ticks_create_one_run(
    real_store: LeaseStore, redis_url: str, nightly: Configure
) -> None:
    stores = [LeaseStore.from_url(redis_url, prefix=real_store.prefix) for _ in range(4)]
    barrier = threading.Barrier(len(stores))
    results: list[list[Decision]] = []
    errors: list[BaseException] = []

    def one(store: LeaseStore) -> None:
        try:
            barrier.wait(timeout=10)
            results.append(tick(store, [NIGHTLY_PATH], now=T0))
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=one, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    for store in stores:
        store.client.close()
    assert not errors, errors
    decisions = [d for result in results for d in result]
    assert [d.kind for d in decisions].count("create") == 1
    assert real_store.run_ids() == [RUN]
    runs = Runs(real_store)
    assert kinds(runs, RUN).count("create") == 1
    planned = [e for e in runs.decisions(RUN) if e["reason"] == "planned 4 items"]
    assert len(planned) == 1
    assert real_store.status(RUN).total == 4
    assert real_store.client.zcard(real_store.keys.job_dates("nightly")) == 1
    # A later tick at the same moment changes nothing either.
    again = tick(real_store, [NIGHTLY_PATH], now=T0)
    assert "create" not in [d.kind for d in again]
    assert real_store.run_ids() == [RUN]
    assert_logged(runs, decisions + again)


@pytest.mark.parametrize(
    ("policy", "first", "expected"),
    [
        ("all", [MARCH_10], ["nightly:2026-03-11", "nightly:2026-03-12", "nightly:2026-03-13"]),
        ("latest", [MARCH_10], ["nightly:2026-03-13"]),
        ("none", [], []),
    ],
)
def test_missed_days_follow_the_catch_up_policy(
    real_store: LeaseStore, nightly: Configure, policy: str, first: list[str], expected: list[str]
) -> None:
    nightly(catch_up=policy)
    registered = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)  # no start within the grace
    runs = Runs(real_store)
    # A new job: the due run is the latest start, caught up unless the policy is none.
    opening = tick(real_store, [NIGHTLY_PATH], now=registered)
    assert real_store.run_ids() == first
    for run_id in first:
        reason = next(e for e in runs.decisions(run_id) if e["kind"] == "catch_up")["reason"]
        assert "no record of this job's runs on the server" in reason
    if not first:
        assert [d.kind for d in opening] == ["waiting"]
        assert "the next fires at 2026-03-11 02:00 UTC" in opening[0].reason
    record = real_store.client.hgetall(real_store.keys.job("nightly"))
    assert int(record[b"registered_at"]) == to_ms(registered)

    later = registered + timedelta(days=3, hours=4)  # 13 March 16:00: 14h past the grace
    decisions = tick(real_store, [NIGHTLY_PATH], now=later)
    assert sorted(real_store.run_ids()) == first + expected
    for run_id in expected:
        events = runs.decisions(run_id)
        catch_up = [e for e in events if e["kind"] == "catch_up"]
        assert len(catch_up) == 1, events
        assert "missed at" in catch_up[0]["reason"]
        assert f"policy {policy}" in catch_up[0]["reason"]
        assert "no record" not in catch_up[0]["reason"]
        # A late run keeps its full six-hour window from when it started.
        assert int(runs.info(run_id)["deadline_at"]) == to_ms(later + timedelta(hours=6))
    assert sorted(d.run_id for d in decisions if d.kind == "catch_up") == expected
    skipped = 3 - len(expected)
    if skipped:
        note = text(real_store.client.hget(real_store.keys.job("nightly"), "last_catch_up"))
        assert note.startswith(f"skipped {skipped} missed dates (policy {policy})")
    # The skipped dates stay skipped, and nothing is created twice.
    tick(real_store, [NIGHTLY_PATH], now=later + timedelta(minutes=1))
    assert sorted(real_store.run_ids()) == first + expected
    assert_logged(runs, decisions)


def test_a_run_started_before_the_first_tick_catches_up_nothing_older(
    real_store: LeaseStore, nightly: Configure
) -> None:
    job = nightly(catch_up="all")
    now = T0 + timedelta(hours=10)  # long past the day's start: the operator starts it
    runs = Runs(real_store)
    runs.ensure(job, DAY, now)
    decisions = tick(real_store, [NIGHTLY_PATH], now=now)
    assert [d.kind for d in decisions] == ["plan", "dispatch"]
    assert real_store.run_ids() == [RUN]  # not the week before it: the job had no runs then
    assert tick(real_store, [NIGHTLY_PATH], now=now + timedelta(days=1)) != []
    assert real_store.run_ids() == [RUN, f"nightly:{(DAY + timedelta(days=1)).isoformat()}"]


def _partial_run(store: LeaseStore) -> Runs:
    """A run past its deadline with one item done, one leased and two pending: partial."""
    runs = Runs(store)
    first = tick(store, [NIGHTLY_PATH], now=T0)
    assert [d.kind for d in first][:2] == ["create", "plan"]
    lease = store.claim(RUN, "night-00000", worker="w1", ttl=60)
    store.commit(lease, {"ok": True})
    store.claim(RUN, "night-00001", worker="w2", ttl=60)
    late = tick(store, [NIGHTLY_PATH], now=T0 + timedelta(hours=6, minutes=1))
    assert [d.kind for d in late] == ["finalize"]
    assert_logged(runs, first + late)
    return runs


def test_deadline_ends_run_partial_and_cli_resume_reopens_it(
    real_store: LeaseStore, redis_url: str, nightly: Configure
) -> None:
    runs = _partial_run(real_store)
    info = runs.info(RUN)
    assert info["state"] == "partial"
    assert info["reason"] == "deadline passed: 1 done of 4 planned, 2 pending, 1 leased"
    final = {"pending": 2, "leased": 1, "done": 1, "dead": 0, "planned": 4, "lost": 0, "late": 0}
    assert json.loads(info["final_counts"]) == final
    assert "finalize" in kinds(runs, RUN)
    assert RUN not in runs.open_runs("nightly")
    with pytest.raises(RunClosed):
        real_store.claim_next(RUN, "w3", limit=10)

    cli = [sys.executable, "-m", "redis_lease", "--url", redis_url, "--prefix", real_store.prefix]
    new_deadline = T0 + timedelta(hours=7)  # after the tick's clock below, ahead of the server's
    done = subprocess.run(
        [*cli, "resume", RUN, "--deadline", new_deadline.isoformat()],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"{RUN}: running" in done.stdout
    info = runs.info(RUN)
    assert info["state"] == "running"
    assert int(info["deadline_at"]) == to_ms(new_deadline)
    assert (
        f"claims allowed until {iso_time(to_ms(new_deadline))}" in done.stdout
    )  # as the CLI prints times
    assert RUN in runs.open_runs("nightly")
    assert kinds(runs, RUN)[-1] == "resume"
    leases = real_store.claim_next(RUN, "w3", limit=10)
    assert sorted(lease.item_id for lease in leases) == ["night-00002", "night-00003"]
    # The next tick keeps it open: its new deadline is still ahead (and its shard jobs
    # are still queued, so nothing is dispatched twice).
    assert tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(hours=6, minutes=2)) == []
    assert runs.info(RUN)["state"] == "running"


def test_api_resume_reopens_a_partial_run(real_store: LeaseStore, nightly: Configure) -> None:
    runs = _partial_run(real_store)
    assert runs.info(RUN)["state"] == "partial"
    with pytest.raises(InvalidInput, match="is in the past"):
        runs.resume(RUN, deadline=runs.server_now() - timedelta(minutes=1))
    decision = runs.resume(RUN, deadline=runs.server_now() + timedelta(hours=2))
    assert decision.kind == "resume"
    assert runs.info(RUN)["state"] == "running"
    assert len(real_store.claim_next(RUN, "w3", limit=10)) == 2
    with pytest.raises(InvalidInput, match="only partial or failed runs resume"):
        runs.resume(RUN)


def transient_planner(failures: list[BaseException]) -> Callable[[date], Iterator[Item]]:
    """A planner that raises each of ``failures`` in turn, once each, then plans 4 items."""

    def plan(business_date: date) -> Iterator[Item]:
        yield Item("early", {})
        if failures:
            raise failures.pop(0)
        yield from (Item(f"i{n}", {}) for n in range(3))

    return plan


def test_a_transient_planner_error_is_planned_again_after_its_back_off(
    real_store: LeaseStore, nightly: Configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = nightly()
    failures: list[BaseException] = [TimeoutError("db timeout"), ConnectionResetError("reset")]
    monkeypatch.setattr(job, "plan_items", transient_planner(failures))
    monkeypatch.setattr(job, "plan_retry_on", (TimeoutError, ConnectionError))
    runs = Runs(real_store)
    first = tick(real_store, [NIGHTLY_PATH], now=T0)
    again = (T0 + timedelta(seconds=10)).isoformat(timespec="seconds")
    assert [(d.kind, d.reason) for d in first] == [
        ("create", first[0].reason),
        (
            "plan_retry",
            f"planning failed (attempt 1), planned again after {again}: planning error: the "
            "planner raised TimeoutError: db timeout",
        ),
    ]
    assert not first.failures
    info = runs.info(RUN)
    assert (info["state"], info["planning_attempts"]) == ("planning", "1")
    assert tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(seconds=9)) == []
    second = tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(seconds=10))
    again = (T0 + timedelta(seconds=30)).isoformat(timespec="seconds")
    assert [(d.kind, d.reason) for d in second] == [
        (
            "plan_retry",
            f"planning failed (attempt 2), planned again after {again}: planning error: the "
            "planner raised ConnectionResetError: reset",
        )
    ]
    assert runs.info(RUN)["state"] == "planning"
    assert tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(seconds=29)) == []
    third = tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(seconds=30))
    assert ("plan", "planned 4 items") in [(d.kind, d.reason) for d in third]
    assert runs.info(RUN)["state"] == "running"
    assert real_store.status(RUN).total == 4  # the item planned before each error, once
    assert_logged(runs, [*first, *second, *third])


def test_a_transient_planner_error_at_the_deadline_fails_the_run(
    real_store: LeaseStore, nightly: Configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = nightly(deadline_after=timedelta(seconds=50))  # 02:00:50, 20 s after T0
    failures: list[BaseException] = [TimeoutError("db timeout")] * 5
    monkeypatch.setattr(job, "plan_items", transient_planner(failures))
    monkeypatch.setattr(job, "plan_retry_on", (TimeoutError,))
    runs = Runs(real_store)
    first = tick(real_store, [NIGHTLY_PATH], now=T0)  # attempt 1; again at +10 s
    assert first[-1].kind == "plan_retry"
    ended = tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(seconds=10))  # +20 s: too late
    reason = (
        "planning error: the planner raised TimeoutError: db timeout (a transient error, "
        "tried 2 times until the deadline)"
    )
    assert [(d.kind, d.reason) for d in ended] == [("finalize", f"failed: {reason}")]
    assert not ended.failures  # a run planning failed is a decision, not a failed tick
    info = runs.info(RUN)
    assert (info["state"], info["reason"]) == ("failed", reason)


def test_an_error_the_job_did_not_call_transient_fails_the_run_at_once(
    real_store: LeaseStore, nightly: Configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = nightly()
    monkeypatch.setattr(job, "plan_items", transient_planner([ValueError("bad config")]))
    monkeypatch.setattr(job, "plan_retry_on", (TimeoutError,))
    decisions = tick(real_store, [NIGHTLY_PATH], now=T0)
    assert decisions[-1].reason == (
        "failed: planning error: the planner raised ValueError: bad config"
    )
    assert Runs(real_store).info(RUN)["state"] == "failed"


def test_a_retry_waits_its_back_off_and_the_last_shard_job_ends_the_run(
    real_store: LeaseStore, nightly: Configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each item fails its first attempt (a transient error, 0.5 s back-off). The shard
    jobs of one dispatch work the retries when due, not at a later tick, and the last of
    them to finish ends the run: no tick after the first."""
    job = nightly(backoff_base_seconds=0.5)
    attempts: dict[str, list[float]] = {}

    def flaky(item: Item, lease: Any) -> dict[str, Any]:
        attempts.setdefault(item.id, []).append(monotonic())
        if len(attempts[item.id]) == 1:
            raise ConnectionError("the ledger timed out")
        return {"n": item.payload["n"]}

    monkeypatch.setattr(job, "handle_item", flaky)
    decisions = tick(real_store, [NIGHTLY_PATH], now=T0)
    assert [d.kind for d in decisions] == ["create", "plan", "dispatch"]
    burst(real_store.client, job.options.queue, f"{real_store.prefix}-w")
    runs = Runs(real_store)
    assert runs.info(RUN)["state"] == "succeeded", runs.decisions(RUN)
    assert runs.decisions(RUN)[-1]["reason"].startswith("succeeded: no item left to work")
    assert len(attempts) == 4 and all(len(times) == 2 for times in attempts.values())
    waits = [times[1] - times[0] for times in attempts.values()]
    # its back-off (0.25-0.5 s: equal jitter), plus the commit interval: no tick in between
    assert all(0.24 <= wait < 0.5 + 2.0 for wait in waits), waits


def test_planner_error_fails_the_run(real_store: LeaseStore, nightly: Configure) -> None:
    fleet_jobs.PLAN["fail_after"] = 2
    runs = Runs(real_store)
    decisions = tick(real_store, [NIGHTLY_PATH], now=T0)
    assert [d.kind for d in decisions] == ["create", "finalize"]
    assert "planning error" in decisions[-1].reason
    info = runs.info(RUN)
    assert info["state"] == "failed"
    assert "planning error" in info["reason"]
    assert "the ledger export is missing" in info["reason"]
    assert RUN not in runs.open_runs("nightly")
    assert real_store.status(RUN).total == 0
    fleet_jobs.PLAN["fail_after"] = None  # a later tick does not plan a failed run again
    assert tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(minutes=1)) == []
    assert runs.info(RUN)["state"] == "failed"
    assert_logged(runs, decisions)


def test_replanning_after_a_crash_adds_only_the_missing_items(
    real_store: LeaseStore, nightly: Configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    items, crash_after = 2 * PLAN_BATCH + 200, PLAN_BATCH + 200  # in the second batch
    fleet_jobs.PLAN.update(items=items, crash_after=crash_after)
    adds: list[tuple[int, int]] = []
    add = real_store.add

    def counting_add(*args: Any, **kwargs: Any) -> tuple[list[str], list[str]]:
        added, existing = add(*args, **kwargs)
        adds.append((len(added), len(existing)))
        return added, existing

    monkeypatch.setattr(real_store, "add", counting_add)
    with pytest.raises(fleet_jobs.PlannerCrash):
        tick(real_store, [NIGHTLY_PATH], now=T0)
    runs = Runs(real_store)
    assert runs.info(RUN)["state"] == "planning"
    assert real_store.status(RUN).total == PLAN_BATCH  # the first batch got in
    assert adds == [(PLAN_BATCH, 0)]
    lease = real_store.claim(RUN, "night-00007", worker="w1", ttl=60)
    real_store.commit(lease, {"before": "crash"})

    fleet_jobs.PLAN["crash_after"] = None
    adds.clear()
    decisions = tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(minutes=1))
    assert decisions[0] == Decision("plan", RUN, f"planned {items} items")
    assert sum(a for a, _ in adds) == items - PLAN_BATCH
    assert sum(e for _, e in adds) == PLAN_BATCH
    status = real_store.status(RUN)
    assert status.total == items
    assert status.counts["done"] == 1
    record = real_store.item(RUN, "night-00007")
    assert (record.state, record.token, record.result) == ("done", lease.token, {"before": "crash"})
    assert runs.info(RUN)["state"] == "running"
    assert_logged(runs, decisions)


def test_burst_adds_shard_jobs_up_to_max_workers(
    real_store: LeaseStore, nightly: Configure
) -> None:
    job = nightly(
        shards=4, workers_per_shard=1, max_shard_jobs=6, deadline_after=timedelta(hours=1)
    )
    fleet_jobs.PLAN["items"] = 40
    runs = Runs(real_store)
    first = tick(real_store, [NIGHTLY_PATH], now=T0)
    assert [d.kind for d in first] == ["create", "plan", "dispatch"]
    assert sum(len(ids) for ids in live_jobs(real_store, RUN).values()) == 4
    for item in ("night-00000", "night-00001"):
        real_store.commit(real_store.claim(RUN, item, worker="w1", ttl=60))

    # Half an hour in, 2 of 40 done: at this rate the run ends long after its deadline.
    slow = tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(minutes=30))
    bursts = [d for d in slow if d.kind == "burst"]
    assert len(bursts) == 1, slow
    reason = bursts[0].reason
    assert "projected finish" in reason and "passes the deadline" in reason
    assert "+2 shard jobs (cap 6)" in reason
    info = runs.info(RUN)
    assert int(info["projected_finish_at"]) > int(info["deadline_at"])
    assert float(info["rate_per_s"]) > 0
    live = live_jobs(real_store, RUN)
    assert sum(len(ids) for ids in live.values()) == job.options.max_shard_jobs
    assert queue(real_store.client, job.options.queue).count == job.options.max_shard_jobs

    # At the cap: no more burst, however far behind.
    later = tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(minutes=31))
    assert "burst" not in [d.kind for d in later]
    assert sum(len(ids) for ids in live_jobs(real_store, RUN).values()) == 6
    events = runs.decisions(RUN, count=200)
    assert [e["kind"] for e in events].count("burst") == 1
    burst_event = next(e for e in events if e["kind"] == "burst")
    assert burst_event["reason"] == reason
    assert_logged(runs, first + slow + later)


def test_tick_publishes_workers_needed_and_the_exporter_serves_it(
    real_store: LeaseStore, nightly: Configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = nightly(shards=2, deadline_after=timedelta(hours=1))
    fleet_jobs.PLAN["items"] = 40
    runs = Runs(real_store)
    tick(real_store, [NIGHTLY_PATH], now=T0)
    info = runs.info(RUN)
    assert info["workers_needed"] == "unknown"  # no worker has recorded a pass: no number
    assert info["workers_needed_basis"] == "unknown: no worker has recorded a pass yet"
    samples = scrape(real_store)
    assert (WORKERS_NEEDED, (("job", "nightly"),)) not in samples
    assert samples[(WORKERS_NEEDED_UNKNOWN, (("job", "nightly"),))] == 1

    for item in ("night-00000", "night-00001"):
        real_store.commit(real_store.claim(RUN, item, worker="w1", ttl=60))
    real_store.fail(real_store.claim(RUN, "night-00002", worker="w1", ttl=60), "boom")
    # 2 items in 100 worker-seconds: 0.02/s per worker; 1 of 3 attempts finished nothing.
    record_pass(real_store, RUN, handled=2, handler_seconds=90.0, busy_seconds=100.0)
    # Deadline 03:00; at 02:30:30, 1,770 s left for 38 items of 1.5 attempts each:
    # ceil(57 / (0.02 x 1,770)) = ceil(1.61) = 2 workers.
    tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(minutes=30))
    info = runs.info(RUN)
    assert info["workers_needed"] == "2", info["workers_needed_basis"]
    assert int(info["workers_needed_at"]) == to_ms(T0 + timedelta(minutes=30))
    assert "38 items x 1.5000 attempts" in info["workers_needed_basis"]
    samples = scrape(real_store)
    assert samples[(WORKERS_NEEDED, (("job", "nightly"),))] == 2
    assert samples[(WORKERS_NEEDED_UNKNOWN, (("job", "nightly"),))] == 0

    # With one spare node of two workers: 2 + 2.
    monkeypatch.setattr(job, "options", replace(job.options, spare_nodes=1, workers_per_node=2))
    tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(minutes=31))
    assert scrape(real_store)[(WORKERS_NEEDED, (("job", "nightly"),))] == 4

    # Finalized at its deadline: the run leaves the job's open runs, the job needs none.
    tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(hours=1))
    assert runs.info(RUN)["state"] in ("partial", "failed")
    samples = scrape(real_store)
    assert samples[(WORKERS_NEEDED, (("job", "nightly"),))] == 0
    assert samples[(WORKERS_NEEDED_UNKNOWN, (("job", "nightly"),))] == 0


def test_workers_needed_sums_the_jobs_running_runs(
    real_store: LeaseStore, nightly: Configure
) -> None:
    # Runs that last past the next day's start: two of them open at once.
    nightly(shards=1, deadline_after=timedelta(hours=30))
    fleet_jobs.PLAN["items"] = 10
    runs = Runs(real_store)
    tick(real_store, [NIGHTLY_PATH], now=T0)
    next_day = T0 + timedelta(days=1)
    tick(real_store, [NIGHTLY_PATH], now=next_day)
    second = f"nightly:{(DAY + timedelta(days=1)).isoformat()}"
    assert runs.open_runs("nightly") == [RUN, second]
    record_pass(real_store, RUN, handled=1, handler_seconds=1.0, busy_seconds=1.0)
    tick(real_store, [NIGHTLY_PATH], now=next_day)
    samples = scrape(real_store)
    # The first run: 10 items at 1/s with 6 h left: 1 worker; the second is unknown.
    assert samples[(WORKERS_NEEDED, (("job", "nightly"),))] == 1
    assert samples[(WORKERS_NEEDED_UNKNOWN, (("job", "nightly"),))] == 1
    record_pass(real_store, second, handled=1, handler_seconds=1.0, busy_seconds=1000.0)
    tick(real_store, [NIGHTLY_PATH], now=next_day)
    # The second: 10 items at 0.001/s with 30 h (108,000 s) left: ceil(0.093) = 1.
    samples = scrape(real_store)
    assert samples[(WORKERS_NEEDED, (("job", "nightly"),))] == 2
    assert samples[(WORKERS_NEEDED_UNKNOWN, (("job", "nightly"),))] == 0


def test_no_burst_for_work_that_fails(real_store: LeaseStore, nightly: Configure) -> None:
    nightly(shards=4, workers_per_shard=1, max_shard_jobs=6, deadline_after=timedelta(hours=1))
    fleet_jobs.PLAN["items"] = 40
    runs = Runs(real_store)
    first = tick(real_store, [NIGHTLY_PATH], now=T0)
    assert [d.kind for d in first] == ["create", "plan", "dispatch"]
    for item in ("night-00000", "night-00001"):  # every attempt fails, none commits
        real_store.fail(real_store.claim(RUN, item, worker="w1", ttl=60), "boom")
    failing = tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(minutes=30))
    assert "burst" not in [d.kind for d in failing], failing
    assert sum(len(ids) for ids in live_jobs(real_store, RUN).values()) == 4
    # Once attempts commit again, a run that is behind gets its burst.
    for item in ("night-00002", "night-00003"):
        real_store.commit(real_store.claim(RUN, item, worker="w1", ttl=60))
    working = tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(minutes=50))
    assert [d.kind for d in working] == ["burst"], working
    assert_logged(runs, first + working)


def test_a_new_failure_streak_after_a_recovery_backs_off_again(
    real_store: LeaseStore, nightly: Configure
) -> None:
    first = tick(real_store, [NIGHTLY_PATH], now=T0)
    assert [d.kind for d in first] == ["create", "plan", "dispatch"]
    for shard in range(FAILURE_STREAK_LIMIT):
        assert record_job_failure(real_store, RUN, shard % 2, "RuntimeError: boom")
    held = tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(seconds=10))
    assert [d.kind for d in held] == ["backoff"], held
    # A shard job ends normally (as process_shard ends one): the streak and back-off end.
    _forget_job(real_store, RUN, "rl-recovered", ended=True)
    info = Runs(real_store).info(RUN)
    assert job_failures(info).streak == 0 and not job_failures(info).backoff_until_ms
    assert info.get("dispatch_backoff_streak") == "0"
    # Three new failures in a row: a new back-off, with its decision.
    for shard in range(FAILURE_STREAK_LIMIT):
        assert record_job_failure(real_store, RUN, shard % 2, "RuntimeError: again")
    again = tick(real_store, [NIGHTLY_PATH], now=T0 + timedelta(seconds=20))
    assert [d.kind for d in again] == ["backoff"], again
    assert "3 shard jobs failed in a row (6 in all; last: shard 0: RuntimeError: again)" in (
        again[0].reason
    )


def test_a_failure_is_not_recorded_on_a_run_deleted_meanwhile(
    real_store: LeaseStore, nightly: Configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    tick(real_store, [NIGHTLY_PATH], now=T0)
    key = real_store.keys.run(RUN)
    client = real_store.client
    send: Callable[..., Any] = client.execute_command
    deleted: list[bool] = []

    def then_retention_deletes(*args: Any, **options: Any) -> Any:
        """Deletes the run's record (as retention does) right after the first command on it."""
        reply = send(*args, **options)
        if not deleted and key in [a.decode() if isinstance(a, bytes) else str(a) for a in args]:
            deleted.append(True)
            send("DEL", key)
        return reply

    monkeypatch.setattr(client, "execute_command", then_retention_deletes)
    record_job_failure(real_store, RUN, 0, "RuntimeError: boom")
    monkeypatch.undo()
    assert deleted
    assert not client.exists(key), client.hgetall(key)
    assert record_job_failure(real_store, RUN, 0, "RuntimeError: late") is False
    assert not client.exists(key)


@pytest.mark.parametrize(("policy", "missed"), [("latest", 2), ("none", 3), ("all", 0)])
def test_missed_scheduled_runs_are_counted_once(
    real_store: LeaseStore, nightly: Configure, policy: str, missed: int
) -> None:
    job = nightly(catch_up=policy)
    key = ("redis_lease_missed_runs_total", (("job", "nightly"),))
    registered = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    tick(real_store, [NIGHTLY_PATH], now=registered)
    assert scrape(real_store)[key] == 0  # a new job missed nothing: nothing expected it

    later = registered + timedelta(days=3, hours=4)  # 11, 12 and 13 March passed unticked
    decisions = tick(real_store, [NIGHTLY_PATH], now=later)
    assert scrape(real_store)[key] == missed
    notes = [d for d in decisions if d.kind == "missed"]
    if policy == "latest":  # on the run created with them, naming them and the fix
        [note] = notes
        assert note.run_id == "nightly:2026-03-13"
        assert note.reason.startswith("2 scheduled runs never created")
        assert "2026-03-11, 2026-03-12" in note.reason
        assert note.reason.endswith(
            f"redis-lease backfill {NIGHTLY_PATH} --from 2026-03-11 --to 2026-03-12"
        )
        assert_logged(Runs(real_store), decisions)
    else:  # none: no run was created to note it on; all: nothing missed
        assert notes == []

    # Ticking again, and backfilling a missed date, counts nothing again.
    tick(real_store, [NIGHTLY_PATH], now=later + timedelta(minutes=1))
    backfill(real_store, job, date(2026, 3, 11), date(2026, 3, 11), now=later)
    assert scrape(real_store)[key] == missed
    # Dates skipped while paused were an operator's choice: not missed.
    pause(real_store, "nightly", by="alice")
    tick(real_store, [NIGHTLY_PATH], now=later + timedelta(days=2))
    resume(real_store, "nightly")
    assert scrape(real_store)[key] == missed


@pytest.mark.parametrize(("cap", "older"), [(missed_runs.MAX_OLDER_DATES, 13), (5, 5)])
def test_dates_older_than_the_catch_up_window_are_missed_too(
    real_store: LeaseStore,
    nightly: Configure,
    monkeypatch: pytest.MonkeyPatch,
    cap: int,
    older: int,
) -> None:
    monkeypatch.setattr(missed_runs, "MAX_OLDER_DATES", cap)
    nightly(catch_up="latest")  # looks back catch_up_days=7
    key = ("redis_lease_missed_runs_total", (("job", "nightly"),))
    registered = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    tick(real_store, [NIGHTLY_PATH], now=registered)
    # 20 days unticked: the window holds 24-30 March (the 30th created, 6 skipped) and
    # 11-23 March lie before it, after the last scheduled time handled (10 March).
    later = registered + timedelta(days=20)
    decisions = tick(real_store, [NIGHTLY_PATH], now=later)
    assert scrape(real_store)[key] == 6 + older
    [note] = [d for d in decisions if d.kind == "missed"]
    assert note.run_id == "nightly:2026-03-30"
    assert note.reason.startswith(f"{6 + older} scheduled runs never created")
    first = date(2026, 3, 24) - timedelta(days=older)
    assert f"--from {first.isoformat()} --to 2026-03-29" in note.reason
    tick(real_store, [NIGHTLY_PATH], now=later + timedelta(minutes=1))  # once each
    assert scrape(real_store)[key] == 6 + older
