"""A tick nothing wedges: a failure in one run or job is recorded and the rest is ticked;
a run listed as open whose record is gone is named lost with what to do (its date is not
one the job's schedule covers, so it is not made again); after the server
lost its data the next tick re-creates the due run and says so; ``status`` says plainly
when a run it has evidence of is gone; a new job's first tick says when it fires next.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pytest
import redis
from typer.testing import CliRunner, Result

from redis_lease import Item, LeaseStore
from redis_lease.cli import app
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.loss.lost_records import lost_key
from redis_lease.fleet.runs.lifecycle import Decision, Runs, to_ms
from redis_lease.fleet.tick.scheduler_tick import NO_RECORD, tick
from tests.fleet_helpers import NIGHTLY_PATH, purge_queue
from tests.helpers import keys_under
from tests.test_run_accounting import NEVER, Configure
from tests.test_run_accounting import nightly as nightly  # the fixture

DAY = date(2031, 5, 4)
RUN = f"nightly:{DAY.isoformat()}"
OTHER_PATH = "tests.test_tick_isolation:other"
GONE = "is gone: the server may have lost its data: check persistence (docs/durability.md)"

#: A second job, ticked after the nightly one.
other = Job(
    "isolation-other", shards=1, deadline_after=timedelta(hours=1), schedule=NEVER, catch_up="none"
)


@other.planner
def plan_other(business_date: date) -> Iterator[Item]:
    """Two items."""
    yield from (Item(f"other-{n}") for n in range(2))


@pytest.fixture
def other_job(redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Job]:
    """The second job, on an RQ queue of this test's own."""
    name = f"{prefix}-other"
    monkeypatch.setattr(other, "options", replace(other.options, queue=name))
    yield other
    client = redis.Redis.from_url(redis_url)
    purge_queue(client, name)
    client.close()


def cli(url: str, prefix: str, *args: str) -> Result:
    """Runs the command line in-process against ``url`` under ``prefix``."""
    return CliRunner().invoke(app, ["--url", url, "--prefix", prefix, *args])


def kinds(decisions: list[Decision]) -> list[tuple[str, str]]:
    """(kind, run) of each decision."""
    return [(d.kind, d.run_id) for d in decisions]


def test_a_run_listed_open_without_a_record_is_named_lost_and_the_rest_is_ticked(
    real_store: LeaseStore, redis_url: str, nightly: Configure, other_job: Job
) -> None:
    job = nightly()
    runs = Runs(real_store)
    now = runs.server_now()
    runs.ensure(job, DAY, now)
    other_run, _ = runs.ensure(other_job, DAY, now)
    bogus = "nightly:2000-01-01"  # listed before the real run; not a date the job fires on
    real_store.client.sadd(real_store.keys.job_open_runs("nightly"), bogus)

    result = tick(real_store, [NIGHTLY_PATH, OTHER_PATH], now=now)
    assert result.failures == []  # a loss found is named and counted, not a failed tick
    [lost] = [d for d in result if d.kind == "lost"]
    assert lost.run_id == bogus and lost.reason.startswith("lost: its record vanished")
    assert f"redis-lease start {NIGHTLY_PATH} --date 2000-01-01" in lost.reason
    assert ("plan", RUN) in kinds(result) and ("plan", other_run) in kinds(result)
    assert bogus not in runs.open_runs("nightly")
    events = runs.decisions(bogus)
    assert [(e["kind"], e["reason"]) for e in events] == [("lost", lost.reason)]
    ttl = real_store.client.pttl(real_store.keys.run_events(bogus))
    assert 0 < ttl <= job.options.retention_days * 86_400_000
    shown = cli(redis_url, real_store.prefix, "status", bogus)
    assert shown.exit_code == 5, shown.output
    assert f"error: run {bogus!r} was lost: its record vanished" in shown.stderr
    assert "add items" not in shown.stderr
    # Named once: the next tick has nothing left to name.
    again = tick(real_store, [NIGHTLY_PATH], now=now + timedelta(minutes=1))
    assert again.failures == [] and "lost" not in [d.kind for d in again]


def test_the_cli_tick_prints_every_decision_and_exits_7_when_work_failed(
    real_store: LeaseStore, redis_url: str, nightly: Configure, other_job: Job
) -> None:
    nightly()
    runs = Runs(real_store)
    runs.ensure(other_job, DAY, runs.server_now())
    bogus = "nightly:2000-01-01"
    real_store.client.sadd(real_store.keys.job_open_runs("nightly"), bogus)
    done = cli(redis_url, real_store.prefix, "tick", NIGHTLY_PATH, OTHER_PATH, "--json")
    assert done.exit_code == 0, done.output  # a lost run is named, not a failure
    printed = [(d["kind"], d["run"]) for d in json.loads(done.stdout)]
    assert ("lost", bogus) in printed and ("plan", other.run_id(DAY)) in printed
    # a known job whose module no longer imports: that job fails, the other is ticked
    real_store.client.hset(real_store.keys.job("isolation-other"), "path", "tests.no_such:x")
    broken = cli(redis_url, real_store.prefix, "tick", "--json")  # every known job
    assert broken.exit_code == 7, broken.output
    assert broken.stderr.startswith("error: 1 of the tick's runs or jobs failed")
    assert len(broken.stderr.splitlines()) == 1


def test_an_error_in_one_run_is_recorded_on_it_and_the_other_runs_are_ticked(
    real_store: LeaseStore, nightly: Configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = nightly()
    runs = Runs(real_store)
    now = runs.server_now()
    broken_run, _ = runs.ensure(job, DAY, now)
    healthy_run, _ = runs.ensure(job, DAY + timedelta(days=1), now)
    status = LeaseStore.status_by_shard  # what the tick reads a run's counts with

    def broken(self: LeaseStore, run_id: str) -> Any:
        if run_id == broken_run:
            raise RuntimeError("disk on fire")
        return status(self, run_id)

    monkeypatch.setattr(LeaseStore, "status_by_shard", broken)
    result = tick(real_store, [NIGHTLY_PATH], now=now)
    reason = "tick failed: RuntimeError: disk on fire"
    assert result.failures == [Decision("error", broken_run, reason)]
    assert ("dispatch", healthy_run) in kinds(result)
    logged = runs.decisions(broken_run)[-1]
    assert (logged["kind"], logged["reason"]) == ("error", reason)


def test_a_job_that_fails_to_load_does_not_stop_the_others(
    real_store: LeaseStore, nightly: Configure, other_job: Job
) -> None:
    nightly()
    runs = Runs(real_store)
    other_run, _ = runs.ensure(other_job, DAY, runs.server_now())
    result = tick(real_store, ["tests.no_such_module:job", OTHER_PATH])
    [failure] = result.failures
    assert (failure.kind, failure.run_id) == ("error", "tests.no_such_module:job")
    assert "cannot import 'tests.no_such_module'" in failure.reason
    assert ("plan", other_run) in kinds(result)


@pytest.mark.parametrize("policy", ["latest", "none", "all"])
def test_after_data_loss_the_next_tick_recreates_the_due_run_and_says_so(
    real_store: LeaseStore, redis_url: str, nightly: Configure, policy: str
) -> None:
    """A run whose deadline is still ahead was lost, not missed: every policy re-creates it.

    The tick after the loss is a new process that remembers nothing of the data set (as
    a cron tick without ``REDIS_LEASE_MARK_FILE``): it cannot tell a wipe from a new
    deployment, and says so (tests/test_data_loss.py has a tick side that remembers).
    """
    nightly(schedule="0 2 * * *", timezone="UTC", catch_up=policy)
    day = datetime.now(UTC).date() + timedelta(days=1)  # its deadline lies ahead of the server
    run_id = f"nightly:{day.isoformat()}"
    start = datetime.combine(day, time(2, 0, 30), UTC)
    assert ("create", run_id) in kinds(tick(real_store, [NIGHTLY_PATH], now=start))
    real_store.commit(real_store.claim(run_id, "night-00000", "w1", ttl=60))

    real_store.client.delete(*keys_under(real_store.client, real_store.prefix))  # data loss
    lost = cli(redis_url, real_store.prefix, "status", run_id)
    assert lost.exit_code == 5 and "not found" in lost.stderr  # nothing shows it existed

    later = start + timedelta(hours=1)  # past the grace, before the deadline
    fresh = LeaseStore.from_url(redis_url, prefix=real_store.prefix)
    decisions = tick(fresh, [NIGHTLY_PATH], now=later)
    fresh.close()
    assert kinds(decisions)[:2] == [("create", run_id), ("plan", run_id)]
    assert decisions[0].reason == f"scheduled at {start.replace(second=0).isoformat()}; {NO_RECORD}"
    runs = Runs(real_store)
    logged = [e["reason"] for e in runs.decisions(run_id) if e["kind"] == "create"]
    assert logged == [decisions[0].reason]
    status = real_store.status(run_id)
    assert (status.planned, status.unfinished, status.counts["done"]) == (4, 4, 0)
    deadline = Runs(real_store).info(run_id)["deadline_at"]
    assert int(deadline) > to_ms(later), "the run keeps its own deadline"


def test_status_says_a_run_is_gone_while_the_server_shows_it_existed(
    real_store: LeaseStore, redis_url: str, nightly: Configure
) -> None:
    job = nightly()
    runs = Runs(real_store)
    runs.ensure(job, DAY, runs.server_now())
    runs.plan(job, RUN)
    # What eviction or a partial restore leaves: the run's keys gone, its listings kept.
    keys = [k for k in keys_under(real_store.client, real_store.prefix) if f"{{{RUN}" in k]
    real_store.client.delete(*keys)

    def status_error() -> str:
        shown = cli(redis_url, real_store.prefix, "status", RUN)
        assert shown.exit_code == 5, shown.output
        assert len(shown.stderr.splitlines()) == 1
        return shown.stderr

    assert f"run {RUN!r} {GONE}" in status_error()  # listed open and in the run index
    tick(real_store, [NIGHTLY_PATH])  # 2031 is not due: named lost, not made again
    assert RUN not in runs.open_runs("nightly")
    assert f"run {RUN!r} was lost: its record vanished" in status_error()
    real_store.client.delete(lost_key(real_store, "nightly"))
    real_store.client.zrem(real_store.keys.runs, RUN)
    assert f"run {RUN!r} {GONE}" in status_error()  # its log holds the lost decision
    real_store.client.delete(real_store.keys.run_events(RUN))
    assert "not found" in status_error()  # no evidence left


def test_the_first_tick_of_a_new_job_says_when_it_fires_next(
    real_store: LeaseStore, nightly: Configure
) -> None:
    nightly(schedule="30 2 * * *", timezone="Europe/Berlin", catch_up="none")
    now = datetime(2031, 5, 4, 12, 0, tzinfo=UTC)  # 14:00 in Berlin: today's start was missed
    decisions = tick(real_store, [NIGHTLY_PATH], now=now)
    assert decisions == [
        Decision(
            "waiting",
            "nightly",
            "no run due now (policy none); the next fires at 2031-05-05 02:30 Europe/Berlin; "
            "to run one now: redis-lease start tests.fleet_jobs:nightly",
        )
    ]
    assert decisions.failures == []
    assert tick(real_store, [NIGHTLY_PATH], now=now + timedelta(minutes=1)) == []


def test_the_cli_shows_a_new_job_how_to_start_it(
    real_store: LeaseStore, redis_url: str, nightly: Configure
) -> None:
    nightly()
    done = cli(redis_url, real_store.prefix, "tick", NIGHTLY_PATH, "--json")
    assert done.exit_code == 0, done.output
    [decision] = json.loads(done.stdout)
    assert (decision["kind"], decision["run"]) == ("waiting", "nightly")
    assert "the next fires at 2028-02-29 00:00 UTC" in decision["reason"]
    assert decision["reason"].endswith("redis-lease start tests.fleet_jobs:nightly")
