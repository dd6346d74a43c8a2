"""Loss is never silent: the data set's mark tells a wiped, restored or partly dropped data set
from the one the tick side wrote to; lost runs are made again where the job's schedule and
catch-up policy cover them, and named lost with what to do where not; each loss is counted
once and shown by the tick, ``status``, ``runs``, the exporter and the dashboard.

The runs are the nightly job's (tests/fleet_jobs.py: daily at 02:00 UTC, here with a 72 h
deadline), ticked at explicit times of the coming days so that their deadlines lie ahead
of the server clock. A loss is made by hand: keys deleted (a wipe, one run's keys, the
mark), or every key put back as it was earlier (an older snapshot restored).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import fakeredis
import pytest
from typer.testing import CliRunner, Result

from redis_lease import Item, LeaseStore
from redis_lease.cli import app
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.loss.data_set_mark import observe, read_mark
from redis_lease.fleet.loss.lost_records import read as read_lost
from redis_lease.fleet.loss.lost_runs import rerun_deadline
from redis_lease.fleet.loss.tick_memory import MARK_FILE_ENV, recall
from redis_lease.fleet.runs.lifecycle import Decision, Runs
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.operate.dashboard import create_app
from tests import fleet_jobs
from tests.fleet_helpers import NIGHTLY_PATH
from tests.helpers import keys_under, scrape
from tests.test_run_accounting import Configure
from tests.test_run_accounting import nightly as nightly  # the fixture

#: Tomorrow and the day after (UTC), so that runs made for them are not past their deadline.
D1 = datetime.now(UTC).date() + timedelta(days=1)
D2 = D1 + timedelta(days=1)
RUN1, RUN2 = f"nightly:{D1}", f"nightly:{D2}"


def at(day: date, hour: int, minute: int = 0, second: int = 30) -> datetime:
    """A time of ``day`` in UTC."""
    return datetime.combine(day, time(hour, minute, second), UTC)


def kinds(decisions: list[Decision]) -> list[tuple[str, str]]:
    """(kind, run) of each decision."""
    return [(d.kind, d.run_id) for d in decisions]


def cli(store: LeaseStore, url: str, *args: str) -> Result:
    """Runs the command line in-process against ``url`` under the store's prefix."""
    return CliRunner().invoke(app, ["--url", url, "--prefix", store.prefix, *args])


def wipe(store: LeaseStore) -> None:
    """Deletes every key under the store's prefix: what a server restarted empty leaves."""
    store.client.delete(*keys_under(store.client, store.prefix))


def run_keys(store: LeaseStore, run_id: str) -> list[str]:
    """Every key of one run (its record, log and shards), as eviction might drop them."""
    return [k for k in keys_under(store.client, store.prefix) if f"{{{run_id}" in k]


def tallied_lost(store: LeaseStore, job: str = "nightly") -> float:
    """The job's ``redis_lease_lost_runs_total`` as the exporter serves it."""
    return scrape(store)[("redis_lease_lost_runs_total", (("job", job),))]


def losses(store: LeaseStore) -> dict[str, float]:
    """``redis_lease_data_set_losses_total`` by kind, as the exporter serves it."""
    return {
        labels[0][1]: value
        for (name, labels), value in scrape(store).items()
        if name == "redis_lease_data_set_losses_total"
    }


@pytest.fixture
def daily(nightly: Configure) -> Iterator[Job]:
    """The nightly job, daily at 02:00 UTC with a 72 h deadline, catching up the latest."""
    yield nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=72), catch_up="latest")


# -- the mark -----------------------------------------------------------------------------


def test_the_mark_is_made_once_and_every_tick_raises_its_seq(real_store: LeaseStore) -> None:
    first = observe(real_store, "nightly")
    second = observe(real_store, "nightly")
    assert (first.id, first.seq, first.loss) == (second.id, 1, None)
    assert (second.seq, second.epoch, second.since_loss) == (2, 0, False)
    remembered = recall(real_store)
    assert remembered is not None and (remembered.id, remembered.seq) == (first.id, 2)
    mark = read_mark(real_store)
    assert mark is not None and mark.id == first.id and mark.losses["replaced"] == 0
    # A tick side that remembers nothing tells nothing, whatever it finds.
    other = LeaseStore(real_store.client, prefix=real_store.prefix)
    assert observe(other, "nightly").loss is None


def test_a_wiped_server_is_told_by_the_side_that_remembers_it_and_the_open_run_made_again(
    real_store: LeaseStore, redis_url: str, daily: Job
) -> None:
    assert ("create", RUN1) in kinds(tick(real_store, [NIGHTLY_PATH], now=at(D1, 2)))
    real_store.commit(real_store.claim(RUN1, "night-00000", "w1", ttl=60))
    before = read_mark(real_store)
    assert before is not None

    wipe(real_store)
    decisions = tick(real_store, [NIGHTLY_PATH], now=at(D1, 3))
    assert kinds(decisions)[:3] == [("data_lost", "nightly"), ("rerun", RUN1), ("plan", RUN1)]
    assert decisions.failures == []
    assert f"mark {before.id} now" in decisions[0].reason
    assert "restarted empty" in decisions[0].reason
    info = Runs(real_store).info(RUN1)
    assert "the tick side remembered it open" in info["after_loss"]
    assert info["replanned_items"] == "4"  # every item planned again: the wipe took them
    status = real_store.status(RUN1)
    assert (status.planned, status.counts["done"], status.counts["pending"]) == (4, 0, 4)
    assert losses(real_store) == {"replaced": 1, "rolled_back": 0, "mark_lost": 0}
    assert tallied_lost(real_store) == 1

    shown = cli(real_store, redis_url, "status", RUN1)
    assert shown.exit_code == 0, shown.output
    assert "after a loss" in shown.stdout and "the tick side remembered it open" in shown.stdout
    assert "re-planned items" in shown.stdout
    listed = cli(real_store, redis_url, "status")
    assert "data set: last loss (replaced) noticed" in listed.stdout
    row = json.loads(cli(real_store, redis_url, "runs", "--json").stdout)[0]
    assert row["run"] == RUN1 and "re-run, 4 items planned again" in row["loss"]
    # Told and made again once: the next tick finds nothing lost.
    again = tick(real_store, [NIGHTLY_PATH], now=at(D1, 3, 1))
    assert {"data_lost", "rerun", "lost"}.isdisjoint(d.kind for d in again)
    assert losses(real_store)["replaced"] == 1 and tallied_lost(real_store) == 1


def test_a_second_side_that_remembers_the_wiped_data_set_does_not_count_it_again(
    real_store: LeaseStore, daily: Job
) -> None:
    other = LeaseStore(real_store.client, prefix=real_store.prefix)
    tick(real_store, [NIGHTLY_PATH], now=at(D1, 2))
    tick(other, [NIGHTLY_PATH], now=at(D1, 2, 1))
    wipe(real_store)
    first = tick(real_store, [NIGHTLY_PATH], now=at(D1, 3))
    second = tick(other, [NIGHTLY_PATH], now=at(D1, 3, 1))
    assert ("data_lost", "nightly") in kinds(first)
    assert "data_lost" not in [d.kind for d in second]
    assert "rerun" not in [d.kind for d in second]  # the first made the run again
    assert losses(real_store)["replaced"] == 1


def test_an_older_snapshot_restored_is_told_by_the_seq_and_the_newer_run_made_again(
    real_store: LeaseStore, nightly: Configure
) -> None:
    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=72), catch_up="all")
    client = real_store.client
    assert ("create", RUN1) in kinds(tick(real_store, [NIGHTLY_PATH], now=at(D1, 2)))
    snapshot = {
        key: (client.dump(key), client.pttl(key)) for key in keys_under(client, real_store.prefix)
    }
    decisions = tick(real_store, [NIGHTLY_PATH], now=at(D2, 2))
    assert ("create", RUN2) in kinds(decisions)
    real_store.commit(real_store.claim(RUN2, "night-00001", "w1", ttl=60))

    wipe(real_store)  # the server restarts from the older snapshot
    for key, (dumped, ttl) in snapshot.items():
        assert dumped is not None
        client.restore(key, max(ttl, 0), dumped, replace=True)
    decisions = tick(real_store, [NIGHTLY_PATH], now=at(D2, 3))
    assert kinds(decisions)[:2] == [("data_lost", "nightly"), ("rerun", RUN2)]
    assert decisions[0].reason.startswith("the data set went back in time")
    assert ("loss", RUN1) in kinds(decisions)  # it lived through the loss: told so
    assert "went back in time" in Runs(real_store).info(RUN1)["after_loss"]
    assert Runs(real_store).info(RUN2)["replanned_items"] == "4"
    assert losses(real_store)["rolled_back"] == 1 and tallied_lost(real_store) == 1
    # Told once: RUN1 is not told again, nothing is counted again.
    later = tick(real_store, [NIGHTLY_PATH], now=at(D2, 3, 1))
    assert {"data_lost", "loss", "rerun"}.isdisjoint(d.kind for d in later)


def test_a_lost_mark_is_made_again_with_its_id_and_counted_once(
    real_store: LeaseStore, daily: Job
) -> None:
    tick(real_store, [NIGHTLY_PATH], now=at(D1, 2))
    before = read_mark(real_store)
    assert before is not None
    real_store.client.delete(real_store.keys.data_set)  # evicted
    fresh = LeaseStore(real_store.client, prefix=real_store.prefix)  # remembers nothing
    decisions = tick(fresh, [NIGHTLY_PATH], now=at(D1, 2, 1))
    assert kinds(decisions)[0] == ("data_lost", "nightly")
    assert "mark vanished" in decisions[0].reason
    after = read_mark(real_store)
    assert after is not None and after.id == before.id and after.losses["mark_lost"] == 1
    # the side that remembered the mark takes the new epoch without counting again
    assert "data_lost" not in [d.kind for d in tick(real_store, [NIGHTLY_PATH], now=at(D1, 2, 2))]
    assert losses(real_store) == {"replaced": 0, "rolled_back": 0, "mark_lost": 1}


def test_no_mark_and_no_copy_is_a_new_data_set_not_a_loss(
    real_store: LeaseStore, daily: Job
) -> None:
    """A deployment that had no mark yet (an older version made its data) loses nothing."""
    real_store.client.hset(real_store.keys.job("nightly"), "path", NIGHTLY_PATH)  # no copy
    decisions = tick(real_store, [NIGHTLY_PATH], now=at(D1, 2))
    assert "data_lost" not in [d.kind for d in decisions]
    assert losses(real_store) == {"replaced": 0, "rolled_back": 0, "mark_lost": 0}


# -- lost runs found in the data set ------------------------------------------------------------


def test_one_runs_keys_deleted_the_next_tick_makes_it_again(
    real_store: LeaseStore, redis_url: str, daily: Job
) -> None:
    """No memory needed: the job's open runs still list it. Not a failure of the tick."""
    tick(real_store, [NIGHTLY_PATH], now=at(D1, 2))
    real_store.client.delete(*run_keys(real_store, RUN1))
    fresh = LeaseStore.from_url(redis_url, prefix=real_store.prefix)  # a new tick process
    decisions = tick(fresh, [NIGHTLY_PATH], now=at(D1, 3))
    fresh.close()
    assert kinds(decisions)[:2] == [("rerun", RUN1), ("plan", RUN1)]
    assert decisions.failures == []
    info = Runs(real_store).info(RUN1)
    assert "listed among the job's open runs" in info["after_loss"]
    assert info["replanned_items"] == "4"
    assert tallied_lost(real_store) == 1
    assert losses(real_store) == {"replaced": 0, "rolled_back": 0, "mark_lost": 0}
    decided = [e["kind"] for e in Runs(real_store).decisions(RUN1)]
    assert decided[:2] == ["created", "rerun"]


def test_a_lost_run_its_policy_does_not_cover_is_named_lost_with_what_to_do(
    real_store: LeaseStore, redis_url: str, nightly: Configure
) -> None:
    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=6), catch_up="none")
    tick(real_store, [NIGHTLY_PATH], now=at(D1, 2))
    real_store.client.delete(*run_keys(real_store, RUN1))
    late = at(D1, 9)  # past its deadline and the grace: policy none does not run it again
    decisions = tick(real_store, [NIGHTLY_PATH], now=late)
    [lost] = [d for d in decisions if d.kind == "lost"]
    todo = f"redis-lease backfill {NIGHTLY_PATH} --from {D1} --to {D1}"
    assert lost.run_id == RUN1 and "catch-up policy (none)" in lost.reason and todo in lost.reason
    assert decisions.failures == [] and RUN1 not in Runs(real_store).open_runs("nightly")
    assert tallied_lost(real_store) == 1

    listed = cli(real_store, redis_url, "runs", "--state", "lost", "--json")
    [row] = json.loads(listed.stdout)
    assert (row["run"], row["state"], row["job"]) == (RUN1, "lost", "nightly")
    assert todo in row["loss"]
    table = cli(real_store, redis_url, "runs")
    assert f"run {RUN1}: lost: its record vanished" in table.stdout
    every = cli(real_store, redis_url, "status")
    assert f"run {RUN1} was lost: its record vanished" in every.stdout
    one = cli(real_store, redis_url, "status", RUN1)
    assert one.exit_code == 5 and f"run {RUN1!r} was lost" in one.stderr and todo in one.stderr
    # Named and counted once.
    assert "lost" not in [d.kind for d in tick(real_store, [NIGHTLY_PATH], now=late)]
    assert tallied_lost(real_store) == 1


def test_a_lost_run_that_had_ended_is_named_not_run_again(
    real_store: LeaseStore, daily: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(fleet_jobs.PLAN, "items", 0)  # nothing to do: it ends at once
    decisions = tick(real_store, [NIGHTLY_PATH], now=at(D1, 2))
    assert ("finalize", RUN1) in kinds(decisions)
    real_store.client.delete(*run_keys(real_store, RUN1))  # within its retention
    decisions = tick(real_store, [NIGHTLY_PATH], now=at(D1, 3))
    [lost] = [d for d in decisions if d.kind == "lost"]
    assert lost.run_id == RUN1 and "it had ended, so it is not run again" in lost.reason
    found = read_lost(real_store, RUN1)
    assert found is not None and found.was == "final" and not found.rerun_at_ms


def test_a_run_lost_again_after_its_rerun_counts_again(real_store: LeaseStore, daily: Job) -> None:
    tick(real_store, [NIGHTLY_PATH], now=at(D1, 2))
    for minute in (1, 2):
        real_store.client.delete(*run_keys(real_store, RUN1))
        decisions = tick(real_store, [NIGHTLY_PATH], now=at(D1, 2, minute))
        assert ("rerun", RUN1) in kinds(decisions)
    assert tallied_lost(real_store) == 2


def test_a_lost_ad_hoc_run_is_named_by_status_and_runs_not_given_the_new_run_hint(
    real_store: LeaseStore, redis_url: str, daily: Job
) -> None:
    real_store.add("adhoc-cleanup", [Item("a"), Item("b")], shards=2)
    real_store.client.delete(*run_keys(real_store, "adhoc-cleanup"))
    decisions = tick(real_store, [NIGHTLY_PATH], now=at(D1, 2))
    [lost] = [d for d in decisions if d.kind == "lost"]
    assert lost.run_id == "adhoc-cleanup" and "the run index lists it" in lost.reason
    assert "redis-lease add adhoc-cleanup" in lost.reason
    one = cli(real_store, redis_url, "status", "adhoc-cleanup")
    assert one.exit_code == 5 and "was lost" in one.stderr
    assert "add items to create it" not in one.stderr
    rows = json.loads(cli(real_store, redis_url, "runs", "--json").stdout)
    [row] = [r for r in rows if r["run"] == "adhoc-cleanup"]
    assert row["state"] == "lost" and "redis-lease add adhoc-cleanup" in row["loss"]
    assert tallied_lost(real_store, job="") == 1
    again = tick(real_store, [NIGHTLY_PATH], now=at(D1, 2, 1))
    assert "lost" not in [d.kind for d in again] and tallied_lost(real_store, job="") == 1


def test_the_dashboard_lists_a_lost_run_as_lost(real_store: LeaseStore, daily: Job) -> None:
    real_store.add("adhoc-gone", [Item("a")], shards=1)
    real_store.client.delete(*run_keys(real_store, "adhoc-gone"))
    tick(real_store, [NIGHTLY_PATH], now=at(D1, 2))
    client = create_app(real_store, secret_key="test-secret").test_client()
    shown_page = client.get("/")
    page = shown_page.get_data(as_text=True)
    assert shown_page.status_code == 200, page
    assert 'data-run="adhoc-gone" data-health="failed"' in page
    assert 'data-field="state">lost</td>' in page
    shown = client.get("/runs/adhoc-gone")
    assert shown.status_code == 404 and "was lost" in shown.get_data(as_text=True)


# -- where the tick side remembers -------------------------------------------------------------


def test_a_mark_file_lets_ticks_in_new_processes_tell_a_wipe(
    real_store: LeaseStore,
    redis_url: str,
    daily: Job,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(MARK_FILE_ENV, str(tmp_path / "state" / "marks.json"))
    first = cli(real_store, redis_url, "start", NIGHTLY_PATH, "--date", str(D1))
    assert first.exit_code == 0, first.output
    wipe(real_store)
    done = cli(real_store, redis_url, "tick", NIGHTLY_PATH, "--json")
    assert done.exit_code == 0, done.output
    printed = [(d["kind"], d["run"]) for d in json.loads(done.stdout)]
    assert ("data_lost", "nightly") in printed
    assert losses(real_store)["replaced"] == 1
    remembered = json.loads((tmp_path / "state" / "marks.json").read_text())
    assert [entry["id"] for entry in remembered.values()] == [read_mark(real_store).id]  # type: ignore[union-attr]


def test_rq_redis_apart_remembers_the_data_set(prefix: str) -> None:
    lease_server, queue_server = fakeredis.FakeServer(), fakeredis.FakeServer()

    def store() -> LeaseStore:  # a new tick process: lease state and RQ on their own servers
        return LeaseStore(
            fakeredis.FakeRedis(server=lease_server),
            prefix=prefix,
            url="fakeredis://lease",
            rq_client=fakeredis.FakeRedis(server=queue_server),
        )

    seen = observe(store(), "nightly")
    fakeredis.FakeRedis(server=lease_server).flushall()  # the lease store's server wiped
    after = observe(store(), "nightly")
    assert after.loss is not None and after.loss.kind == "replaced"
    assert after.loss.previous == seen.id and after.id != seen.id


# -- which lost dates are made again ----------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "day", "now", "made"),
    [
        ("none", D1, at(D1, 3), True),  # before its deadline: on time, any policy
        ("none", D1, at(D2, 9), False),  # late
        ("latest", D1, at(D1, 9), True),  # the newest scheduled date
        ("latest", D1, at(D2, 9), False),  # D2's is newer
        ("all", D1, at(D2, 9), True),  # within catch_up_days
        ("all", D1, at(D1 + timedelta(days=9), 9), False),  # older than catch_up_days
        ("all", D2, at(D1, 9), False),  # not scheduled yet
    ],
)
def test_a_lost_date_is_made_again_when_the_schedule_and_policy_cover_it(
    nightly: Configure, policy: str, day: date, now: datetime, made: bool
) -> None:
    job = nightly(
        schedule="0 2 * * *", deadline_after=timedelta(hours=6), catch_up=policy, catch_up_days=7
    )
    deadline = rerun_deadline(job, day, now)
    assert (deadline is not None) == made
    if deadline is not None:
        on_time = at(day, 8, 0, 0)
        assert deadline == (on_time if on_time > now else now + timedelta(hours=6))


def test_a_lost_run_made_outside_the_schedule_is_not_made_again(nightly: Configure) -> None:
    job = nightly(
        schedule="0 2 * * 1", deadline_after=timedelta(hours=6), catch_up="all"
    )  # Mondays only
    tuesday = next(
        D1 + timedelta(days=n) for n in range(7) if (D1 + timedelta(days=n)).weekday() == 1
    )
    assert rerun_deadline(job, tuesday, at(tuesday, 3)) is None
