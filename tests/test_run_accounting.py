"""Honest run accounting: planned items are recorded, lost and late items are counted,
the deadline bars new leases on the server clock, and a run ends ``succeeded`` only when
exactly its planned items were done before its deadline.

The runs here belong to the nightly job of ``tests/fleet_jobs.py`` (its options set
per test); their deadlines are real, on the server clock, so the tests wait for the
server clock to pass them (polling it, with a deadline of their own).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import date, timedelta
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from redis_lease import InvalidInput, Item, LeaseStore, RedisUnavailable
from redis_lease.cli import app
from redis_lease.errors import RunClosed
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import Runs, to_ms
from redis_lease.fleet.runs.run_states import RESUMABLE_STATES, in_words
from redis_lease.fleet.tick.scheduler_tick import tick
from tests import fleet_jobs
from tests.fleet_helpers import NIGHTLY_PATH, purge_queue
from tests.helpers import scrape, wait_past
from tests.redis_server import RedisServer

DAY = date(2031, 5, 4)
RUN = f"nightly:{DAY.isoformat()}"
#: A schedule that fires on 29 February only: no run falls due by itself in these tests.
NEVER = "0 0 29 2 *"

Configure = Callable[..., Job]


@pytest.fixture
def nightly(redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Configure]:
    """Sets the nightly job's options for this test (its own RQ queue, no schedule)."""
    name = f"{prefix}-q"
    for key, value in {"items": 4, "fail_after": None, "crash_after": None}.items():
        monkeypatch.setitem(fleet_jobs.PLAN, key, value)

    def configure(**options: Any) -> Job:
        job = fleet_jobs.nightly
        settings = {"queue": name, "schedule": NEVER, "catch_up": "none", **options}
        monkeypatch.setattr(job, "options", replace(job.options, **settings))
        return job

    configure()
    yield configure
    client = redis.Redis.from_url(redis_url)
    purge_queue(client, name)
    client.close()


def planned_run(store: LeaseStore, job: Job, items: int, seconds: float) -> tuple[Runs, int]:
    """The job's run of DAY, planned with ``items`` items, due ``seconds`` from now (server
    clock); returns its Runs and the deadline in ms."""
    fleet_jobs.PLAN["items"] = items
    runs = Runs(store)
    now = runs.server_now()
    runs.ensure(job, DAY, now, now + timedelta(seconds=seconds))
    assert runs.plan(job, RUN) == items
    return runs, int(runs.info(RUN)["deadline_at"])


def item(n: int) -> str:
    """The id of the nightly planner's item ``n``."""
    return f"night-{n:05d}"


def test_planning_records_planned_items_and_the_deadline_on_every_shard(
    store: LeaseStore, nightly: Configure
) -> None:
    job = nightly(shards=3)
    fleet_jobs.PLAN.update(items=700, crash_after=600)  # one batch of PLAN_BATCH gets in
    runs = Runs(store)
    now = runs.server_now()
    runs.ensure(job, DAY, now, now + timedelta(hours=1))
    with pytest.raises(fleet_jobs.PlannerCrash):
        runs.plan(job, RUN)
    assert "planned_items" not in runs.info(RUN)
    assert store.status(RUN).planned == 500  # while planning: what has been added so far
    fleet_jobs.PLAN["crash_after"] = None
    assert runs.plan(job, RUN) == 700  # planning again counts each distinct item once
    status = store.status(RUN)
    assert (status.planned, status.total, status.lost, status.late) == (700, 700, 0, 0)
    assert runs.info(RUN)["planned_items"] == "700"
    deadline = runs.info(RUN)["deadline_at"]
    for shard in range(3):
        meta = store.client.hget(store.keys.shard(RUN, shard)[0], "deadline_at")
        assert meta is not None and int(meta) == int(deadline)


def test_a_commit_after_the_deadline_ends_the_run_partial(
    store: LeaseStore, nightly: Configure
) -> None:
    runs, deadline_ms = planned_run(store, nightly(), items=3, seconds=2)
    leases = [store.claim(RUN, item(n), "w1", ttl=60) for n in range(3)]
    for lease in leases[:2]:
        store.commit(lease, {"ok": True})
    wait_past(store.client, deadline_ms, timeout=10)
    with pytest.raises(RunClosed, match="passed its deadline"):
        store.claim_next(RUN, "w2")
    store.commit(leases[2], {"ok": True})  # granted before the deadline: accepted, counted late
    status = store.status(RUN)
    assert (status.counts["done"], status.unfinished, status.late) == (3, 0, 1)

    decisions = tick(store, [NIGHTLY_PATH], now=runs.server_now())
    assert [d.kind for d in decisions if d.run_id == RUN] == ["finalize"]
    info = runs.info(RUN)
    assert info["state"] == "partial"
    assert info["reason"] == (
        "deadline passed: 3 done of 3 planned, 1 committed after the deadline"
    )
    assert json.loads(info["final_counts"])["late"] == 1
    assert (
        scrape(store)[("redis_lease_late_commits_total", (("job", "nightly"), ("run", RUN)))] == 1
    )


def test_a_run_finished_before_its_deadline_but_ticked_after_it_succeeds(
    store: LeaseStore, nightly: Configure
) -> None:
    runs, deadline_ms = planned_run(store, nightly(), items=2, seconds=2)
    for n in range(2):
        store.commit(store.claim(RUN, item(n), "w1", ttl=60))
    wait_past(store.client, deadline_ms, timeout=10)
    tick(store, [NIGHTLY_PATH], now=runs.server_now())
    info = runs.info(RUN)
    assert info["state"] == "succeeded", info
    assert info["reason"] == "deadline passed: 2 done of 2 planned"


def test_items_whose_records_vanished_are_lost_and_the_run_cannot_succeed(
    store: LeaseStore, nightly: Configure
) -> None:
    runs, _ = planned_run(store, nightly(shards=2), items=8, seconds=3600)
    victim = store.shard_for(RUN, item(0))
    in_victim = [item(n) for n in range(8) if store.shard_for(RUN, item(n)) == victim]
    assert 1 < len(in_victim) < 8
    store.commit(store.claim(RUN, in_victim[0], "w1", ttl=60))
    store.client.delete(store.keys.shard(RUN, victim)[2])  # what eviction does to the items hash
    # Workers drain the run: the index entries left without a record are dropped.
    while leases := store.claim_next(RUN, "w1", limit=10):
        for lease in leases:
            store.commit(lease)
    lost = len(in_victim) - 1
    status = store.status(RUN)
    assert (status.planned, status.unfinished, status.lost) == (8, 0, lost)
    assert status.counts["done"] == 8 - lost

    tick(store, [NIGHTLY_PATH], now=runs.server_now())
    info = runs.info(RUN)
    assert info["state"] == "partial"
    assert info["reason"] == (
        f"no item left to work: {8 - lost} done of 8 planned, {lost} lost (records vanished: "
        "check maxmemory-policy and persistence)"
    )
    samples = scrape(store)
    assert samples[("redis_lease_lost_items", (("job", "nightly"), ("run", RUN)))] == lost
    assert samples[("redis_lease_planned_items", (("job", "nightly"), ("run", RUN)))] == 8


def test_burst_and_finalize_agree_that_a_dead_item_is_neither_work_left_nor_done(
    store: LeaseStore, nightly: Configure
) -> None:
    runs, _ = planned_run(store, nightly(shards=1), items=4, seconds=3600)
    store.commit(store.claim(RUN, item(0), "w1", ttl=60))
    store.fail(store.claim(RUN, item(1), "w1", ttl=60), "no such account", permanent=True)
    start = runs.server_now()
    tick(store, [NIGHTLY_PATH], now=start)  # the first rate sample: 2 finished
    assert runs.info(RUN)["sample_done"] == "2"
    store.commit(store.claim(RUN, item(2), "w1", ttl=60))
    later = start + timedelta(seconds=10)
    tick(store, [NIGHTLY_PATH], now=later)
    info = runs.info(RUN)
    # One item finished in 10 s, one unfinished left (the dead one is not work left).
    assert float(info["rate_per_s"]) == 0.1
    assert int(info["projected_finish_at"]) == to_ms(later) + 10_000
    store.commit(store.claim(RUN, item(3), "w1", ttl=60))
    tick(store, [NIGHTLY_PATH], now=later + timedelta(seconds=1))
    info = runs.info(RUN)
    assert info["state"] == "partial"
    assert info["reason"] == "no item left to work: 3 done of 4 planned, 1 dead"


def test_resume_lifts_the_deadline_bar_and_says_so(store: LeaseStore, nightly: Configure) -> None:
    runs, deadline_ms = planned_run(store, nightly(), items=3, seconds=2)
    store.commit(store.claim(RUN, item(0), "w1", ttl=60))
    wait_past(store.client, deadline_ms, timeout=10)
    with pytest.raises(RunClosed, match="passed its deadline"):
        store.claim(RUN, item(1), "w2")
    tick(store, [NIGHTLY_PATH], now=runs.server_now())
    assert runs.info(RUN)["state"] == "partial"
    with pytest.raises(InvalidInput, match="past its deadline; resume it with a new deadline"):
        runs.resume(RUN)

    until = runs.server_now() + timedelta(hours=1)
    decision = runs.resume(RUN, until)
    assert decision.reason == (
        "resumed by an operator; deadline bar lifted: claims allowed until "
        f"{until.isoformat(timespec='seconds')}"
    )
    assert runs.decisions(RUN)[-1]["reason"] == decision.reason
    leases = store.claim_next(RUN, "w2", limit=10)
    assert sorted(lease.item_id for lease in leases) == [item(1), item(2)]
    for shard in range(store.shard_count(RUN)):
        meta = store.client.hget(store.keys.shard(RUN, shard)[0], "deadline_at")
        assert meta is not None and int(meta) == to_ms(until)


def test_a_resume_cut_short_leaves_the_run_to_resume_again(
    store: LeaseStore, nightly: Configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shards are reopened before the run's state changes, so a failure between them
    leaves a run that an operator can resume again (not one stuck running and barred)."""
    runs, deadline_ms = planned_run(store, nightly(), items=2, seconds=1)
    wait_past(store.client, deadline_ms, timeout=10)
    tick(store, [NIGHTLY_PATH], now=runs.server_now())
    assert runs.info(RUN)["state"] == "failed"
    until = runs.server_now() + timedelta(hours=1)

    def cut(self: LeaseStore, run_id: str, closed: bool) -> None:
        raise RedisUnavailable("Redis went away")

    with monkeypatch.context() as patch:
        patch.setattr(LeaseStore, "set_closed", cut)
        with pytest.raises(RedisUnavailable):
            runs.resume(RUN, until)
    assert runs.info(RUN)["state"] == "failed", "the state is the last thing to change"
    runs.resume(RUN, until)
    assert runs.info(RUN)["state"] == "running"
    assert len(store.claim_next(RUN, "w", limit=10)) == 2


def test_a_canceled_run_is_final_resume_refuses_it_and_names_the_fix(
    real_store: LeaseStore, redis_url: str, nightly: Configure
) -> None:
    """An operator ended the run on purpose: resuming it would re-apply work they meant to
    stop. The library and the command line refuse it in one line that says what to do."""
    runs, _ = planned_run(real_store, nightly(), items=2, seconds=3600)
    assert runs.cancel(RUN)
    expected = (
        f"run {RUN!r} is canceled, which is final (only partial or failed runs resume); "
        f"to run {DAY} again, `redis-lease start JOB --date {DAY}` once its retention has ended"
    )
    with pytest.raises(InvalidInput) as refused:
        runs.resume(RUN, runs.server_now() + timedelta(hours=1))
    assert str(refused.value) == expected
    args = ["--url", redis_url, "--prefix", real_store.prefix, "resume", RUN, "--deadline", "1h"]
    shown = CliRunner().invoke(app, args)
    assert shown.exit_code == InvalidInput.exit_code == 2
    assert shown.stderr.strip().splitlines() == [f"error: {expected}"]
    assert runs.info(RUN)["state"] == "canceled"
    with pytest.raises(RunClosed):  # its items stay unclaimable
        real_store.claim_next(RUN, "w1", limit=10)


def test_the_resume_command_help_names_the_resumable_states(redis_url: str) -> None:
    shown = CliRunner().invoke(app, ["resume", "--help"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert f"Reopen a {in_words(RESUMABLE_STATES)} run;" in " ".join(shown.stdout.split())


def test_status_shows_the_accounting(
    real_store: LeaseStore, redis_url: str, nightly: Configure
) -> None:
    planned_run(real_store, nightly(), items=3, seconds=3600)
    real_store.commit(real_store.claim(RUN, item(0), "w1", ttl=60))
    cli = CliRunner()
    args = ["--url", redis_url, "--prefix", real_store.prefix, "status", RUN]
    shown = cli.invoke(app, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert (data["planned"], data["lost"], data["late"], data["unfinished"]) == (3, 0, 0, 2)
    human = cli.invoke(app, args)
    assert human.exit_code == 0, human.output
    for field in ("planned", "lost", "committed after the deadline"):
        assert field in human.stdout


def test_status_reports_an_evicting_server_as_a_danger(
    private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    server = private_redis(**{"maxmemory-policy": "allkeys-lru"})
    client = redis.Redis.from_url(server.url)
    LeaseStore(client, prefix=prefix).add("r", [Item("a")])
    cli = CliRunner()
    args = ["--url", server.url, "--prefix", prefix, "status", "r"]
    shown = cli.invoke(app, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    dangers = json.loads(shown.stdout)["dangers"]
    assert len(dangers) == 1 and "maxmemory-policy is allkeys-lru" in dangers[0]
    human = cli.invoke(app, args)
    assert human.exit_code == 0, human.output
    lines = [line for line in human.stdout.splitlines() if line.startswith("danger: ")]
    assert len(lines) == 1 and "set maxmemory-policy noeviction" in lines[0]
    listing = cli.invoke(app, args[:-1])
    assert [line for line in listing.stdout.splitlines() if line.startswith("danger: ")] == lines
    client.close()


def test_status_of_a_server_that_cannot_evict_shows_no_danger(
    private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    server = private_redis(**{"maxmemory-policy": "noeviction"})
    client = redis.Redis.from_url(server.url)
    LeaseStore(client, prefix=prefix).add("r", [Item("a")])
    args = ["--url", server.url, "--prefix", prefix, "status", "r"]
    shown = CliRunner().invoke(app, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["dangers"] == []
    assert "danger" not in CliRunner().invoke(app, args).stdout
    client.close()
