"""Recovery that cannot hurt: the tick's recovery paths never run an ended date again, and a
lost run is made again once or named lost, never neither, whatever call of the path fails.

The runs are the nightly job's (tests/fleet_jobs.py), ticked in-process at explicit times of
the coming days. Tick sides are stores of their own on one server and prefix: each has the
process memory of a worker that ticks (:mod:`redis_lease.fleet.loss.tick_memory`). Faults are one
Redis call of the path failed, before it is sent or after it ran (its reply lost), by
:mod:`tests.redis_faults`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import pytest

from redis_lease import LeaseStore, RedisLeaseError, RedisUnavailable
from redis_lease.fleet.loss import lost_runs, tick_memory
from redis_lease.fleet.loss.lost_records import read as read_lost
from redis_lease.fleet.loss.lost_runs import MADE_AGAIN
from redis_lease.fleet.runs.job_tallies import counted_runs_key
from redis_lease.fleet.runs.lifecycle import Decision, Runs
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.protocol.store.leader import Leadership, hold_leadership
from tests.fleet_helpers import NIGHTLY_PATH
from tests.helpers import keys_under
from tests.redis_faults import FailingCalls, client_calls
from tests.test_run_accounting import Configure
from tests.test_run_accounting import nightly as nightly  # the fixture

D0 = datetime.now(UTC).date() + timedelta(days=1)
RUN0 = f"nightly:{D0}"


def at(day: date, hour: int, minute: int = 0) -> datetime:
    """A time of ``day`` in UTC."""
    return datetime.combine(day, time(hour, minute, 30), UTC)


def kinds(decisions: list[Decision], run_id: str) -> list[str]:
    """The kinds of the decisions about ``run_id``."""
    return [d.kind for d in decisions if d.run_id == run_id]


def run_keys(store: LeaseStore, run_id: str) -> list[str]:
    """Every key of one run: what its retention's end, or eviction, takes."""
    return [k for k in keys_under(store.client, store.prefix) if f"{{{run_id}" in k]


def wipe(store: LeaseStore) -> None:
    """Every key under the prefix deleted: what a server restarted empty leaves."""
    store.client.delete(*keys_under(store.client, store.prefix))


def expire_ended(store: LeaseStore, run_id: str) -> None:
    """What a run's retention does to it, and the trim of its counted end a day later."""
    store.client.delete(*run_keys(store, run_id))
    key = counted_runs_key(store, run_id.split(":", 1)[0])
    ends = [m for m in store.client.zrange(key, 0, -1) if m.decode().startswith(f"{run_id}@")]
    if ends:
        store.client.zrem(key, *ends)


@pytest.fixture
def sides(redis_url: str, prefix: str) -> Iterator[list[LeaseStore]]:
    """Three tick sides (worker processes that may lead), each with its own client."""
    stores = [LeaseStore.from_url(redis_url, prefix=prefix) for _ in range(3)]
    yield stores
    for store in stores:
        store.close()


# -- a returning leader ----------------------------------------------------------------------


@pytest.mark.parametrize("catch_up", ["all", "latest"])
def test_a_returning_former_leader_never_runs_an_ended_date_again(
    real_store: LeaseStore, sides: list[LeaseStore], nightly: Configure, catch_up: str
) -> None:
    """A creates D0; B ends it; D0's keys expire and its counted end is trimmed; A ticks
    again days later. Before, A's memory made D0 a lost open run: under ``all`` it was made
    again (its effects sent again), under ``latest`` (the default) it was named lost, a
    false alert. A's memory was superseded by B's ticks: it is not gone by."""
    nightly(
        schedule="0 2 * * *",
        deadline_after=timedelta(hours=6),
        catch_up=catch_up,
        catch_up_days=30,
        retention_days=1,
    )
    a, b, _ = sides
    assert "create" in kinds(tick(a, [NIGHTLY_PATH], now=at(D0, 2)), RUN0)
    ended = tick(b, [NIGHTLY_PATH], now=at(D0, 9))  # past its deadline
    assert "finalize" in kinds(ended, RUN0)
    expire_ended(real_store, RUN0)

    later = tick(a, [NIGHTLY_PATH], now=at(D0 + timedelta(days=5), 2))
    assert kinds(later, RUN0) == []
    assert not real_store.client.exists(real_store.keys.run(RUN0))
    assert read_lost(real_store, RUN0) is None
    assert later.failures == []


def test_a_memory_another_side_superseded_is_dropped_not_gone_by(
    sides: list[LeaseStore], nightly: Configure
) -> None:
    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=6), catch_up="all")
    a, b, _ = sides
    tick(a, [NIGHTLY_PATH], now=at(D0, 2))
    mine = tick_memory.recall(a)
    assert mine is not None and RUN0 in mine.runs
    tick(b, [NIGHTLY_PATH], now=at(D0, 3))
    tick(a, [NIGHTLY_PATH], now=at(D0, 4))  # sees B's ticks in the mark's seq
    again = tick_memory.recall(a)
    assert again is not None and again.state_of(RUN0) == tick_memory.OPEN
    assert again.seq > mine.seq + 1  # relearned from the server, not carried over


def test_after_a_wipe_a_memory_in_doubt_names_the_run_and_does_not_make_it_again(
    real_store: LeaseStore, sides: list[LeaseStore], nightly: Configure
) -> None:
    """A led and made the run; its leadership had a break (another may have ticked: B
    ended the run); the server is wiped; A ticks again. Its memory is in doubt: the run is
    named lost with what to do, never made again."""
    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=6), catch_up="all")
    a, b, _ = sides
    tick(a, [NIGHTLY_PATH], now=at(D0, 2))
    tick_memory.distrust(a)
    assert "finalize" in kinds(tick(b, [NIGHTLY_PATH], now=at(D0, 9)), RUN0)
    wipe(real_store)

    decisions = tick(a, [NIGHTLY_PATH], now=at(D0, 9, 5))
    assert kinds(decisions, "nightly")[:1] == ["data_lost"]
    assert kinds(decisions, RUN0) == ["lost"]
    lost = read_lost(real_store, RUN0)
    assert lost is not None and lost.was == "unknown" and not lost.rerun_at_ms
    assert "may have ended" in lost.todo and "redis-lease backfill" in lost.todo
    assert not real_store.client.exists(real_store.keys.run(RUN0))
    assert kinds(tick(a, [NIGHTLY_PATH], now=at(D0, 9, 6)), RUN0) == []  # stays named


# -- every call of the path failed in turn ---------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What became of the lost run once the ticks after the failed one ran."""

    exists: bool
    created: int  # "created" decisions in its log since it was lost (a log write may fail)
    made_again: bool  # its lost record says the tick made it again
    named: bool  # its lost record names it lost (not made again)
    tallied: int


def outcome(store: LeaseStore, run_id: str) -> Outcome:
    exists = bool(store.client.exists(store.keys.run(run_id)))
    created = sum(e["kind"] == "created" for e in Runs(store).decisions(run_id, 100))
    lost = read_lost(store, run_id)
    made_again = lost is not None and lost.todo == MADE_AGAIN and bool(lost.rerun_at_ms)
    named = lost is not None and lost.todo != MADE_AGAIN and not lost.rerun_at_ms
    tallies = store.client.hget(store.keys.job_tallies("nightly"), "lost")
    return Outcome(exists, created, made_again, named, int(tallies or 0))


def run_made(redis_url: str, prefix: str) -> tuple[LeaseStore, FailingCalls]:
    """A tick side of its own under ``prefix``, its client's calls counted, that made the
    run of D0 at its scheduled time."""
    store = LeaseStore.from_url(redis_url, prefix=prefix)
    calls = client_calls(store.client)
    tick(store, [NIGHTLY_PATH], now=at(D0, 2))
    return store, calls


def walk(
    store: LeaseStore, calls: FailingCalls, lose: str, nth: int | None, when: datetime
) -> None:
    """One tick with its ``nth`` call failed (None: none), then two plain ticks."""
    with calls.failing(nth, lose_reply=lose == "reply"), contextlib.suppress(RedisLeaseError):
        tick(store, [NIGHTLY_PATH], now=when)  # the failed call may stop it
    # A lock whose taking lost its reply is held until its time to live ends (the job's tick
    # lock 60 s, the run's planner lock 120 s): as then.
    store.client.delete(store.keys.job_tick_lock("nightly"), store.keys.run_planner(RUN0))
    for minute in (1, 2):
        tick(store, [NIGHTLY_PATH], now=when + timedelta(minutes=minute))


@pytest.mark.parametrize("lose", ["request", "reply"])
@pytest.mark.parametrize("loss", ["run-keys", "wipe"])
def test_each_failed_call_of_making_a_lost_run_again_leaves_it_made_once_or_named(
    redis_url: str, prefix: str, nightly: Configure, loss: str, lose: str
) -> None:
    """The run's keys deleted (found among the job's open runs) or the server wiped (found
    in the tick side's memory); the next tick has its n-th Redis call failed, for every n
    the path makes; two plain ticks follow. The run is made again exactly once, or named
    lost, and its loss counted once. Before, a failure between the lost record and the run
    left a record that read "named" while no run existed, for good."""
    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=72), catch_up="latest")
    when = at(D0, 3)

    def lost_run(n: int | None) -> tuple[LeaseStore, FailingCalls]:
        store, calls = run_made(redis_url, f"{prefix}-{n}")
        if loss == "wipe":
            wipe(store)
        else:
            store.client.delete(*run_keys(store, RUN0))
        return store, calls

    store, calls = lost_run(None)
    with calls.failing(None):
        tick(store, [NIGHTLY_PATH], now=when)
    total = calls.calls
    assert outcome(store, RUN0) == Outcome(True, 1, True, False, 1)
    wipe(store)
    store.close()
    assert total > 10  # the path was walked

    for n in range(1, total + 1):
        store, calls = lost_run(n)
        try:
            walk(store, calls, lose, n, when)
            assert calls.failed, f"call {n} of {total} was never made"
            found = outcome(store, RUN0)
            assert found.tallied == 1, (n, found)
            assert found.exists != found.named, (n, found)  # made again, or named: never neither
            if found.exists:
                assert found.created <= 1 and found.made_again, (n, found)
                assert RUN0 in Runs(store).open_runs("nightly"), (n, found)
                assert store.status(RUN0).planned == 4, (n, found)
        finally:
            wipe(store)
            store.close()


@pytest.mark.parametrize("lose", ["request", "reply"])
def test_a_run_that_ended_before_a_wipe_is_never_made_again_whatever_call_failed(
    redis_url: str, prefix: str, nightly: Configure, lose: str
) -> None:
    """A tick that ends the run (its deadline passed) has its n-th call failed, for every n;
    then the server is wiped and the tick side ticks again. If the run had reached a final
    state, it is never made again (named lost, or forgotten as ended); if it had not, it is
    made again or named."""
    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=6), catch_up="all")
    ending = at(D0, 9)

    store, calls = run_made(redis_url, f"{prefix}-n")
    with calls.failing(None):
        assert "finalize" in kinds(tick(store, [NIGHTLY_PATH], now=ending), RUN0)
    total = calls.calls
    wipe(store)
    store.close()

    for n in range(1, total + 1):
        store, calls = run_made(redis_url, f"{prefix}-{n}")
        try:
            with calls.failing(n, lose_reply=lose == "reply"), contextlib.suppress(RedisLeaseError):
                tick(store, [NIGHTLY_PATH], now=ending)
            state = (store.client.hget(store.keys.run(RUN0), "state") or b"").decode()
            wipe(store)
            later = tick(store, [NIGHTLY_PATH], now=ending + timedelta(minutes=1))
            decided = kinds(later, RUN0)
            made = {"create", "catch_up", "rerun"} & set(decided)
            if state not in ("planning", "running"):  # it had ended: never made again
                assert not made, (n, state, decided)
                assert not store.client.exists(store.keys.run(RUN0)), (n, state, decided)
            else:  # it had not: made again (its date is covered), or named
                assert decided[:1] in (["rerun"], ["lost"]), (n, state, decided)
        finally:
            wipe(store)
            store.close()


def test_a_memory_reads_back_whole_and_an_older_one_still_reads() -> None:
    """What a tick side keeps in a file or RQ's Redis: its states, scheduled times and
    unsettled jobs come back as written; an entry of an earlier release (runs only) reads
    with every run open. Anything else is no memory."""
    memory = tick_memory.Remembered(
        "mark",
        2,
        7,
        {RUN0: ("nightly", 5), "adhoc": ("", 6)},
        {RUN0: tick_memory.ENDING},
        {"nightly": (1_000, True)},
        frozenset({"nightly"}),
    )
    assert tick_memory.Remembered.from_json(memory.to_json()) == memory
    older = {"id": "mark", "epoch": 2, "seq": 7, "runs": {RUN0: ["nightly", 5]}}
    read = tick_memory.Remembered.from_json(older)
    assert read is not None and read.state_of(RUN0) == tick_memory.OPEN and not read.fired
    assert tick_memory.Remembered.from_json({"id": "mark"}) is None
    hostile = {**older, "states": {RUN0: "made-up", "elsewhere": tick_memory.ENDING}}
    read = tick_memory.Remembered.from_json(hostile)
    assert read is not None and read.states == {}


def test_a_tick_that_takes_its_memory_for_superseded_and_stops_still_leaves_it_named(
    real_store: LeaseStore,
    sides: list[LeaseStore],
    nightly: Configure,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the recovery model: a tick's look at the mark whose reply was lost (or
    another side's tick) moves the mark's seq past the memory's, so the next tick takes the
    memory for superseded; that tick stops before it remembers the job's runs again; then
    the server is wiped. Before, a superseded memory was dropped: the open run was neither
    made again nor named. Now it is doubtful: named lost, never made again."""
    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=72), catch_up="all")
    a = sides[0]
    assert "create" in kinds(tick(a, [NIGHTLY_PATH], now=at(D0, 2)), RUN0)
    real_store.client.hincrby(real_store.keys.data_set, "seq", 1)  # a tick's reply lost
    with monkeypatch.context() as patched:

        def stops(*args: object) -> None:
            raise RedisUnavailable("injected: the job's runs not remembered")

        patched.setattr(lost_runs, "remember_open", stops)
        with contextlib.suppress(RedisLeaseError):
            tick(a, [NIGHTLY_PATH], now=at(D0, 2, 5))
    wipe(real_store)

    decisions = tick(a, [NIGHTLY_PATH], now=at(D0, 2, 10))
    assert kinds(decisions, RUN0) == ["lost"]
    lost = read_lost(real_store, RUN0)
    assert lost is not None and lost.was == "unknown"


def test_a_run_begun_to_be_made_again_by_one_side_is_finished_by_another_as_a_rerun(
    real_store: LeaseStore,
    sides: list[LeaseStore],
    nightly: Configure,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found in review: A notices a wipe and records the lost run as being made again, then
    its call to make it fails; B, which remembers nothing, ticks next. Before, B's tick made
    the date's run as a plain new run: no ``after_loss``, so an effect whose ledger went
    with the wipe was sent again without a lookup. Now any tick side finishes what the
    record began: the run is made again after a loss, its shards marked."""
    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=72), catch_up="latest")
    a, b = sides[0], LeaseStore(sides[1].client, prefix=sides[1].prefix)
    assert "create" in kinds(tick(a, [NIGHTLY_PATH], now=at(D0, 2)), RUN0)
    wipe(real_store)
    with monkeypatch.context() as patched:

        def fails(*args: object, **kwargs: object) -> None:
            raise RedisUnavailable("injected: the run is not made")

        patched.setattr(Runs, "ensure", fails)
        with contextlib.suppress(RedisLeaseError):
            tick(a, [NIGHTLY_PATH], now=at(D0, 3))
    lost = read_lost(real_store, RUN0)
    assert lost is not None and lost.todo == MADE_AGAIN and not lost.rerun_at_ms

    decisions = tick(b, [NIGHTLY_PATH], now=at(D0, 3, 1))
    assert kinds(decisions, RUN0)[:2] == ["rerun", "plan"]
    info = Runs(real_store).info(RUN0)
    assert "after_loss" in info
    metas = [
        real_store.client.hget(real_store.keys.shard(RUN0, s)[0], "after_loss") for s in (0, 1)
    ]
    assert all(metas), metas


def test_a_run_made_of_a_lost_runs_id_by_any_door_is_careful_with_its_effects(
    real_store: LeaseStore, nightly: Configure
) -> None:
    """A run named lost, then made by hand (``redis-lease backfill``, ``start``): its
    effects' ledger went with the lost run, so it is made as after a loss."""
    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=6), catch_up="none")
    runs = Runs(real_store)
    assert "create" in kinds(tick(real_store, [NIGHTLY_PATH], now=at(D0, 2)), RUN0)
    real_store.client.delete(*run_keys(real_store, RUN0))
    assert kinds(tick(real_store, [NIGHTLY_PATH], now=at(D0, 9)), RUN0) == ["lost"]
    from tests import fleet_jobs

    run_id, created = runs.ensure(fleet_jobs.nightly, D0, at(D0, 10))  # what backfill does
    assert created and run_id == RUN0
    assert "its run was lost before" in runs.info(RUN0)["after_loss"]


def test_a_worker_that_does_not_lead_keeps_a_doubtful_copy_and_names_what_a_wipe_took(
    real_store: LeaseStore, sides: list[LeaseStore], nightly: Configure
) -> None:
    """Found in review: with one Redis and no memory file (the default), only the leader
    remembered the data set, and after a wipe another worker usually takes the lease. It
    saw no loss, and made the latest date's run again as a plain new run. Now a worker
    that does not lead keeps a doubtful copy of the server's state each try: it tells the
    wipe, names the run lost, and makes nothing again."""
    from redis_lease.fleet.tick.leader import TickLeader

    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=72), catch_up="latest")
    a, b = sides[0], sides[1]
    assert "create" in kinds(tick(a, [NIGHTLY_PATH], now=at(D0, 2)), RUN0)
    assert hold_leadership(a, "a#1", 60_000).held

    class Waiting(TickLeader):
        def _tick(self, leadership: Leadership) -> None:
            return None

    worker = Waiting(b, "b", [NIGHTLY_PATH], lambda line: None, every=1)
    try:
        worker.step()  # another holds the lease: it keeps a copy
    finally:
        worker.close()
    copy = tick_memory.recall(b)
    assert copy is not None and copy.state_of(RUN0) == tick_memory.DOUBTFUL
    wipe(real_store)

    decisions = tick(b, [NIGHTLY_PATH], now=at(D0, 3))
    assert kinds(decisions, "nightly")[:1] == ["data_lost"]
    assert kinds(decisions, RUN0) == ["lost"]
    assert not real_store.client.exists(real_store.keys.run(RUN0))


def test_a_leader_in_doubt_doubts_its_machines_memory_file_too(
    real_store: LeaseStore,
    sides: list[LeaseStore],
    nightly: Configure,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Found in review: a memory file is one machine's. A (on machine A) made the run, B
    (on machine B) ended it, the server was wiped, and A leads again after a break. Before,
    A's doubt covered its process memory only, and its file made the ended run again."""
    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=6), catch_up="all")
    a, b = sides[0], sides[1]
    monkeypatch.setenv(tick_memory.MARK_FILE_ENV, str(tmp_path / "machine-a.json"))
    tick(a, [NIGHTLY_PATH], now=at(D0, 2))
    monkeypatch.setenv(tick_memory.MARK_FILE_ENV, str(tmp_path / "machine-b.json"))
    assert "finalize" in kinds(tick(b, [NIGHTLY_PATH], now=at(D0, 9)), RUN0)
    wipe(real_store)
    monkeypatch.setenv(tick_memory.MARK_FILE_ENV, str(tmp_path / "machine-a.json"))
    tick_memory.distrust(a)

    decisions = tick(a, [NIGHTLY_PATH], now=at(D0, 9, 5))
    assert "rerun" not in kinds(decisions, RUN0)
    assert not real_store.client.exists(real_store.keys.run(RUN0))
