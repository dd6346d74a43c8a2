"""Business dates follow the job's timezone through daylight-saving changes.

The tick runs on its injected clock every 20 minutes across both switches of 2026
(Europe/Berlin: 29 March, 02:00 skipped; 25 October, 02:00-03:00 twice), for jobs
scheduled inside the skipped and the doubled hour. Every date gets exactly one run,
none is skipped or doubled, and each planner is given the run's nominal business
date, never the time it ran. A backfill across the switches (America/New_York) does
the same, and the installed scheduler entry fires at the job's local time, in UTC
one hour apart before and after each switch.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from redis_lease import LeaseStore
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.backfill import backfill
from redis_lease.fleet.tick.schedule import (
    arm_next,
    entries,
    install,
    installed,
    remove,
    scheduler_for,
)
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.fleet.worker.shard_job import ActiveLease
from redis_lease.protocol.leases import Item
from tests.fleet_helpers import purge_queue, text

#: What each job's planner was given, in order.
PLANNED: dict[str, list[Any]] = {}


def _job(name: str, schedule: str, timezone: str) -> Job:
    job = Job(
        name,
        shards=1,
        schedule=schedule,
        timezone=timezone,
        deadline_after=timedelta(hours=1),
        catch_up="all",
        catch_up_days=3,
        catch_up_grace_seconds=900,
        queue="rltest-dst",
    )

    @job.planner
    def plan(business_date: date) -> Iterator[Item]:
        PLANNED.setdefault(name, []).append(business_date)
        yield Item(f"{name}-{business_date.isoformat()}", {"date": business_date.isoformat()})

    @job.handler
    def handle(item: Item, lease: ActiveLease) -> None:
        """Not run: no worker in these tests."""

    return job


#: 02:30 does not exist in Berlin on 29 March 2026 and happens twice on 25 October.
berlin_0230 = _job("berlin-0230", "30 2 * * *", "Europe/Berlin")
#: 02:00 is the skipped hour's first minute, and the doubled hour's.
berlin_0200 = _job("berlin-0200", "0 2 * * *", "Europe/Berlin")
#: 01:30 in New York: doubled on 1 November 2026.
new_york = _job("new-york", "30 1 * * *", "America/New_York")

SPRING = (datetime(2026, 3, 26, 12, tzinfo=UTC), datetime(2026, 4, 1, 12, tzinfo=UTC))
AUTUMN = (datetime(2026, 10, 22, 12, tzinfo=UTC), datetime(2026, 10, 28, 12, tzinfo=UTC))


@pytest.fixture
def queue_cleanup(real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The jobs' shard jobs go to a queue of this test's own, deleted afterwards."""
    from dataclasses import replace

    name = f"{real_store.prefix}-q"
    for job in (berlin_0230, berlin_0200, new_york):
        monkeypatch.setattr(job, "options", replace(job.options, queue=name))
    PLANNED.clear()
    yield name
    purge_queue(real_store.client, name)


def _days(first: date, last: date) -> list[date]:
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


@pytest.mark.parametrize("path", ["tests.test_dst:berlin_0230", "tests.test_dst:berlin_0200"])
@pytest.mark.parametrize("window", [SPRING, AUTUMN], ids=["spring", "autumn"])
def test_ticks_across_a_switch_make_one_run_per_date(
    real_store: LeaseStore, queue_cleanup: str, path: str, window: tuple[datetime, datetime]
) -> None:
    job = berlin_0230 if path.endswith("0230") else berlin_0200
    start, end = window
    moment = start
    creates: list[str] = []
    while moment <= end:
        decisions = tick(real_store, [path], now=moment)
        assert not decisions.failures, decisions
        creates += [d.run_id for d in decisions if d.kind in ("create", "catch_up")]
        moment += timedelta(minutes=20)
    # The first tick finds the day's 02:x0 passed (a new job: on time while its deadline is
    # ahead, else caught up); from then on one run per local date, the switch included.
    first_date = (start + timedelta(days=1)).astimezone(job.zone).date()
    last_date = end.astimezone(job.zone).date()
    wanted = [job.run_id(day) for day in _days(first_date, last_date)]
    assert sorted(set(creates)) == sorted(creates), "a date was created twice"
    made = sorted(real_store.run_ids())
    assert [r for r in made if r in wanted] == wanted, "a date was skipped"
    assert len(creates) == len(set(made))
    # Each planner call got the nominal business date of its run, never the tick's time.
    assert sorted(PLANNED[job.name]) == sorted(date.fromisoformat(r.split(":")[1]) for r in made)
    runs = Runs(real_store)
    for run_id in made:
        info = runs.info(run_id)
        assert info["business_date"] == run_id.split(":")[1]
        items = [r.payload["date"] for r in real_store.items(run_id, 0)]
        assert items == [info["business_date"]]


def test_the_switch_days_fire_at_their_local_time(
    real_store: LeaseStore, queue_cleanup: str
) -> None:
    """On 29 March the 02:30 run starts at 03:00 CEST (the first time after the gap); on
    25 October at the first 02:30 (CEST), and the second 02:30 (CET) makes nothing new."""
    path = "tests.test_dst:berlin_0230"
    before = datetime(2026, 3, 28, 12, tzinfo=UTC)
    tick(real_store, [path], now=before)
    gap = datetime(2026, 3, 29, 1, 0, 30, tzinfo=UTC)  # 03:00:30 CEST
    decisions = tick(real_store, [path], now=gap)
    created = [d for d in decisions if d.kind == "create"]
    assert [d.run_id for d in created] == ["berlin-0230:2026-03-29"]
    assert created[0].reason == "scheduled at 2026-03-29T03:00:00+02:00"

    tick(real_store, [path], now=datetime(2026, 10, 24, 12, tzinfo=UTC))
    first = datetime(2026, 10, 25, 0, 30, 30, tzinfo=UTC)  # 02:30:30 CEST
    decisions = tick(real_store, [path], now=first)
    assert [d.reason for d in decisions if d.kind == "create"] == [
        "scheduled at 2026-10-25T02:30:00+02:00"
    ]
    second = datetime(2026, 10, 25, 1, 30, 30, tzinfo=UTC)  # 02:30:30 CET, the same date
    again = tick(real_store, [path], now=second)
    assert [d for d in again if d.kind in ("create", "catch_up")] == []
    assert real_store.run_ids().count("berlin-0230:2026-10-25") == 1


def test_backfill_across_both_switches_skips_and_doubles_nothing(
    real_store: LeaseStore, queue_cleanup: str
) -> None:
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    spring = backfill(real_store, new_york, date(2026, 3, 6), date(2026, 3, 10), now=now)
    autumn = backfill(real_store, new_york, date(2026, 10, 30), date(2026, 11, 3), now=now)
    wanted = [new_york.run_id(d) for d in _days(date(2026, 3, 6), date(2026, 3, 10))]
    wanted += [new_york.run_id(d) for d in _days(date(2026, 10, 30), date(2026, 11, 3))]
    assert [d.run_id for d in spring + autumn] == wanted
    assert sorted(real_store.run_ids()) == sorted(wanted)
    # The planner runs at the tick, a month later: it is given the nominal dates.
    tick(real_store, ["tests.test_dst:new_york"], now=now + timedelta(minutes=1))
    assert sorted(PLANNED["new-york"]) == sorted(date.fromisoformat(r[-10:]) for r in wanted)
    reasons = {d.run_id: d.reason for d in spring + autumn}
    assert "scheduled for 2026-03-08T01:30:00-05:00" in reasons["new-york:2026-03-08"]
    assert "scheduled for 2026-11-01T01:30:00-04:00" in reasons["new-york:2026-11-01"]


@pytest.mark.parametrize(
    ("now", "local", "utc"),
    [
        # 02:00 Berlin is 01:00 UTC in winter and 00:00 UTC in summer.
        (datetime(2026, 3, 27, 12, tzinfo=UTC), "2026-03-28 02:00 CET (+01:00)", "01:00"),
        # 29 March has no 02:00: the entry fires at the first time after the gap.
        (datetime(2026, 3, 28, 12, tzinfo=UTC), "2026-03-29 03:00 CEST (+02:00)", "01:00"),
        (datetime(2026, 3, 30, 12, tzinfo=UTC), "2026-03-31 02:00 CEST (+02:00)", "00:00"),
        (datetime(2026, 10, 25, 12, tzinfo=UTC), "2026-10-26 02:00 CET (+01:00)", "01:00"),
    ],
)
def test_installed_entry_fires_at_the_jobs_local_time(
    real_store: LeaseStore, queue_cleanup: str, now: datetime, local: str, utc: str
) -> None:
    path = "tests.test_dst:berlin_0200"
    ids: list[str] = []
    try:
        ids = install(real_store, path, berlin_0200, interval=60, now=now)
        rows = {row["id"]: row for row in entries(real_store, berlin_0200)}
        at = rows[ids[0]]
        assert at["next"] == local
        assert at["next_utc"].endswith(f"T{utc}:00+00:00")
        assert at["cron"] == "0 2 * * *" and at["timezone"] == "Europe/Berlin"
        score = real_store.client.zscore(
            scheduler_for(real_store, berlin_0200).scheduled_jobs_key, ids[0]
        )
        assert datetime.fromtimestamp(score or 0, UTC).isoformat() == at["next_utc"]
    finally:
        remove(real_store, berlin_0200)
        purge_queue(real_store.client, queue_cleanup, extra_job_ids=tuple(ids))
    assert entries(real_store, berlin_0200) == []
    assert text(real_store.client.exists(*[f"rq:job:{i}" for i in ids])) == "0"


def test_each_tick_arms_the_next_local_time_and_drops_the_one_that_ran(
    real_store: LeaseStore, queue_cleanup: str
) -> None:
    path = "tests.test_dst:berlin_0200"
    ids: list[str] = []
    try:
        ids = install(real_store, path, berlin_0200, interval=60, now=SPRING[0])
        assert ids[0].endswith("-at-20260327T0100Z")  # 02:00 CET
        # The entry ran; the tick after it arms the next one, across the switch.
        for moment, wanted in [
            (datetime(2026, 3, 27, 1, 0, 5, tzinfo=UTC), "-at-20260328T0100Z"),
            (datetime(2026, 3, 28, 1, 0, 5, tzinfo=UTC), "-at-20260329T0100Z"),  # 03:00 CEST
            (datetime(2026, 3, 29, 1, 0, 5, tzinfo=UTC), "-at-20260330T0000Z"),  # 02:00 CEST
        ]:
            armed = arm_next(real_store, path, berlin_0200, now=moment)
            ids.append(armed)
            assert armed.endswith(wanted)
            assert arm_next(real_store, path, berlin_0200, now=moment) == armed  # idempotent
            at_entries = [r["id"] for r in entries(real_store, berlin_0200) if "-at-" in r["id"]]
            assert at_entries == [armed]
        assert installed(real_store, berlin_0200)
    finally:
        remove(real_store, berlin_0200)
        purge_queue(real_store.client, queue_cleanup, extra_job_ids=tuple(ids))
    assert not installed(real_store, berlin_0200)
