"""The tick leader's lease (tick_leader.lua), a job's tick lock fenced by its token
(tick_lock.lua), and a leader's tick that no longer leads: it changes nothing.

The worker processes that hold the lease and tick are in tests/test_tick_leader_fleet.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from datetime import time as clock

import pytest

from redis_lease import LeaseStore, run_worker
from redis_lease.errors import InvalidInput
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.loss.tick_memory import DOUBTFUL, OPEN, Remembered, keep, recall
from redis_lease.fleet.tick.leader import TickLeader, check_jobs
from redis_lease.fleet.tick.scheduler_tick import NOT_LEADER, tick
from redis_lease.limits import TICK_LEADER_RENEW_MS, TICK_LEADER_TTL_MS
from redis_lease.protocol.store.leader import (
    BUSY,
    STALE,
    TAKEN,
    Leadership,
    hold_leadership,
    job_tick_lock,
    release_leadership,
    still_leading,
)
from tests import leader_jobs
from tests.fleet_helpers import NIGHTLY_PATH, Configure, configure_nightly, wait_for
from tests.helpers import keys_under, stable_dump

#: 30 seconds after the nightly job's 02:00 start tomorrow (UTC), as tests/test_tick.py.
DAY = datetime.now(UTC).date() + timedelta(days=1)
T0 = datetime.combine(DAY, clock(2, 0, 30), UTC)


@pytest.fixture
def nightly(real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Configure]:
    """The nightly job on an RQ queue of this test's own."""
    yield from configure_nightly(real_store, monkeypatch, items=4)


def test_one_holder_at_a_time_and_a_new_token_for_each_new_holder(store: LeaseStore) -> None:
    first = hold_leadership(store, "w1", 10_000)
    assert (first.held, first.token, first.holder) == (True, 1, "w1")
    assert first.expires_ms - first.now_ms == 10_000
    other = hold_leadership(store, "w2", 10_000)
    assert (other.held, other.token, other.holder) == (False, 1, "w1")
    renewed = hold_leadership(store, "w1", 10_000)
    assert (renewed.held, renewed.token) == (True, 1), "a holder renews with its token"
    assert release_leadership(store, "w2").holder == "w1", "another's release changes nothing"
    released = release_leadership(store, "w1")
    assert (released.held, released.token, released.holder) == (False, 1, "")
    taken = hold_leadership(store, "w2", 10_000)
    assert (taken.held, taken.token) == (True, 2), "released: another takes it at once"


def test_an_expired_lease_goes_to_the_next_that_asks_with_the_next_token(
    store: LeaseStore,
) -> None:
    assert hold_leadership(store, "w1", 50).held
    taken = wait_for(
        lambda: (lease := hold_leadership(store, "w2", 10_000)).held and lease,
        5,
        "the expired lease to be taken",
    )
    assert taken.token == 2
    back = hold_leadership(store, "w1", 10_000)
    assert (back.held, back.holder) == (False, "w2"), "the old holder does not get it back"


def test_the_job_lock_refuses_an_older_token_and_yields_to_a_newer_one(
    store: LeaseStore,
) -> None:
    with job_tick_lock(store, "nightly", 60_000, Leadership("w1", 1)) as (taken, owner):
        assert taken == TAKEN
        with job_tick_lock(store, "nightly", 60_000, Leadership("w1", 1)) as (again, _):
            assert again == BUSY, "the same token: the lock is held"
        with job_tick_lock(store, "nightly", 60_000, Leadership("w2", 2)) as (newer, newer_owner):
            assert newer == TAKEN, "a newer leader takes it from an older one at once"
            assert store.client.get(store.keys.job_tick_lock("nightly")) in (
                newer_owner,
                newer_owner.encode(),
            )
        assert owner != newer_owner
    with job_tick_lock(store, "nightly", 60_000, Leadership("w1", 1)) as (late, _):
        assert late == STALE, "once a newer leader took it, an older one is refused for good"
    assert store.client.get(store.keys.job_tick_fence("nightly")) in (b"2", "2")


def test_a_tick_with_no_leader_takes_the_same_lock_only_when_it_is_free(
    store: LeaseStore,
) -> None:
    """A plain tick (cron, rq-scheduler) takes the job's one lock through the same script with
    no token: it waits its turn behind a leader's tick and is never refused for good."""
    lock_key = store.keys.job_tick_lock("nightly")
    with job_tick_lock(store, "nightly", 60_000, Leadership("w1", 3)) as (led, _):
        assert led == TAKEN
        with job_tick_lock(store, "nightly", 60_000) as (plain, _):
            assert plain == BUSY, "a leader's tick holds the lock"
    assert store.client.get(lock_key) is None, "the leader's tick released it"
    with job_tick_lock(store, "nightly", 60_000) as (plain, owner):
        assert plain == TAKEN, "free, and a fence of 3 does not refuse a tick with no token"
        assert store.client.get(lock_key) in (owner, owner.encode())
        assert 0 < store.client.pttl(lock_key) <= 60_000
        with job_tick_lock(store, "nightly", 60_000) as (second, _):
            assert second == BUSY, "a second plain tick skips the job"
        with job_tick_lock(store, "nightly", 60_000, Leadership("w1", 3)) as (same, _):
            assert same == BUSY, "the fence's own token waits for the plain tick"
    assert store.client.get(lock_key) is None
    assert store.client.get(store.keys.job_tick_fence("nightly")) in (b"3", "3")


def test_still_leading_asks_the_lease_and_the_job_lock(store: LeaseStore) -> None:
    lease = hold_leadership(store, "w1", 10_000)
    me = Leadership("w1", lease.token)
    with job_tick_lock(store, "nightly", 1_000, me) as (_, owner):
        assert still_leading(store, me, "nightly", owner, 60_000)
        left = store.client.pttl(store.keys.job_tick_lock("nightly"))
        assert left > 10_000, f"asking keeps a long tick's lock: {left} ms left"
        assert not still_leading(store, me, "nightly", "someone-else", 60_000)
        release_leadership(store, "w1")
        assert not still_leading(store, me, "nightly", owner, 60_000)
        assert not still_leading(store, me)


def test_a_late_tick_of_a_former_leader_changes_nothing(
    real_store: LeaseStore, nightly: Configure
) -> None:
    """Leader w1 (token 1) is paused; w2 takes over (token 2) and ticks; w1's late tick,
    given the same clock, returns a not_leader decision and leaves every key as it was."""
    store = real_store
    assert hold_leadership(store, "w1", 1).token == 1
    time.sleep(0.005)  # the 1 ms lease runs out: w1 stands for a worker paused past it
    lease = hold_leadership(store, "w2", 10_000)
    assert (lease.held, lease.token) == (True, 2)
    made = tick(store, [NIGHTLY_PATH], now=T0, leader=Leadership("w2", 2))
    assert [d.kind for d in made].count("create") == 1
    before = {key: stable_dump(store.client, key) for key in keys_under(store.client, store.prefix)}
    later = T0 + timedelta(minutes=1)
    late = tick(store, [NIGHTLY_PATH], now=later, leader=Leadership("w1", 1))
    assert [d.kind for d in late] == [NOT_LEADER]
    after = {key: stable_dump(store.client, key) for key in keys_under(store.client, store.prefix)}
    assert after == before, "the late tick wrote something"
    again = tick(store, [NIGHTLY_PATH], now=later, leader=Leadership("w2", 2))
    assert NOT_LEADER not in [d.kind for d in again], "the leader itself still ticks"


def test_a_leader_that_lost_its_lease_stops_before_its_first_step(
    real_store: LeaseStore, nightly: Configure
) -> None:
    """No newer leader ticked the job yet, but the lease is another's: still nothing written."""
    store = real_store
    hold_leadership(store, "w1", 1)
    time.sleep(0.005)
    assert hold_leadership(store, "w2", 10_000).held
    before = {key: stable_dump(store.client, key) for key in keys_under(store.client, store.prefix)}
    late = tick(store, [NIGHTLY_PATH], now=T0, leader=Leadership("w1", 1))
    assert [d.kind for d in late] == [NOT_LEADER]
    after = {key: stable_dump(store.client, key) for key in keys_under(store.client, store.prefix)}
    fence = store.keys.job_tick_fence("nightly")
    assert {k: v for k, v in after.items() if k != fence} == before, "only the fence moved"


def test_jobs_are_checked_before_a_worker_starts() -> None:
    assert [job.name for job in check_jobs([NIGHTLY_PATH])] == ["nightly"]
    with pytest.raises(InvalidInput, match=re.escape("cannot import 'tests.no_such_module'")):
        check_jobs(["tests.no_such_module:job"])
    with pytest.raises(InvalidInput, match=re.escape("must look like package.module:attr")):
        check_jobs(["tests.fleet_jobs"])
    with pytest.raises(InvalidInput, match=re.escape("is a function, not a redis_lease.Job")):
        check_jobs(["tests.fleet_jobs:item_id"])
    with pytest.raises(InvalidInput, match=r"has no handler: decorate a function with @bare"):
        check_jobs(["tests.leader_jobs:bare"])


def test_run_worker_from_python_checks_its_jobs_first(redis_url: str, prefix: str) -> None:
    with pytest.raises(InvalidInput, match=r"has no handler"):
        run_worker(jobs=["tests.leader_jobs:bare"], url="redis://127.0.0.1:1/0", prefix=prefix)
    here = Job("here", schedule="0 0 29 2 *")  # in no module's globals: no path to import
    here.planner(leader_jobs.plan)
    here.handler(leader_jobs.handle)
    with pytest.raises(InvalidInput, match=r"not defined at the top level"):
        run_worker(jobs=[here], url=redis_url, prefix=prefix)
    with pytest.raises(InvalidInput, match=r"tick_every 0.5 is under 1 second"):
        run_worker(jobs=[leader_jobs.scheduled], url=redis_url, tick_every=0.5)


def test_run_worker_from_python_works_and_frees_the_lease_when_it_stops(
    real_store: LeaseStore, queue_name: str
) -> None:
    """A burst worker given a Job object: it starts, finds its queue empty, stops, and the
    lease it may have taken is free at once."""
    lines: list[str] = []
    run_worker(
        jobs=[leader_jobs.scheduled],
        url=real_store.url,
        prefix=real_store.prefix,
        queues=[queue_name],
        burst=True,
        simple=True,
        say=lines.append,
    )
    holder, token = real_store.client.hmget(real_store.keys.tick_leader, ["holder", "token"])
    assert token == b"1", "the worker took the lease"
    assert holder == b"", "the lease is freed when the worker stops"
    records = real_store.client.hvals(real_store.keys.workers[0])
    assert len(records) == 1 and b"stopped_at" in records[0], "it ran with its fleet watch"
    assert all("tick" in line for line in lines), lines


def test_two_leader_threads_one_leads_and_a_closed_one_hands_over_at_once(
    real_store: LeaseStore, nightly: Configure
) -> None:
    """In one process: one of two TickLeader threads leads and ticks; closed, it frees the
    lease, and the other leads at its next try (one renewal period, not the lease's TTL)."""
    said: list[str] = []
    first = TickLeader(real_store, "w1", [NIGHTLY_PATH], said.append, every=1)
    second = TickLeader(real_store, "w2", [NIGHTLY_PATH], said.append, every=1)
    first.start()
    wait_for(lambda: first.ticks > 0, 10, "w1 to lead and tick")
    second.start()
    try:
        assert second.leadership is None and first.leadership == Leadership(first.holder, 1)
        first.close()
        since = time.monotonic()
        wait_for(lambda: second.leadership, 2 * TICK_LEADER_RENEW_MS / 1000 + 1, "w2 to lead")
        assert time.monotonic() - since < TICK_LEADER_TTL_MS / 1000, "not the lease's TTL"
        assert second.leadership == Leadership(second.holder, 2)
        wait_for(lambda: second.ticks > 0, 10, "w2 to tick")
    finally:
        second.close()
        first.close()
    assert [line.split(":")[0] for line in said if ": tick leader (token" in line] == [
        "worker w1",
        "worker w2",
    ]


def test_a_leader_that_loses_its_lease_midway_stops_at_its_next_step(
    real_store: LeaseStore, nightly: Configure
) -> None:
    """The lease passes to w2 while w1's tick plans a run: the step under way (that run's
    tick) ends, the next step does not start, and the decisions made so far are kept."""
    store = real_store
    me = Leadership("w1", hold_leadership(store, "w1", 10_000).token)
    passed: list[int] = []

    def lease_passes(run_id: str, planned: int) -> None:  # w1 stands still here
        if not passed:
            release_leadership(store, "w1")
            passed.append(hold_leadership(store, "w2", 10_000).token)

    made = tick(store, [NIGHTLY_PATH], now=T0, progress=lease_passes, leader=me)
    kinds = [d.kind for d in made]
    assert passed == [2]
    assert kinds[0] == "create" and "plan" in kinds, kinds
    assert kinds[-1] == NOT_LEADER and kinds.count(NOT_LEADER) == 1, kinds


def test_a_lost_lease_hash_does_not_stop_the_ticks(
    real_store: LeaseStore, nightly: Configure
) -> None:
    """Two leaders ticked the job (its fence is at token 2), then the lease's hash is lost
    (deleted, evicted, a failover): the next holder starts again at token 1, below the
    fence. Its tick is refused, it asks for a token past the fence, and ticks with it."""
    store = real_store
    for name in ("w0", "w9"):
        me = Leadership(name, hold_leadership(store, name, 10_000).token)
        assert NOT_LEADER not in [d.kind for d in tick(store, [NIGHTLY_PATH], T0, leader=me)]
        release_leadership(store, name)
    fence = store.keys.job_tick_fence(leader_jobs_name(NIGHTLY_PATH))
    assert store.client.get(fence) == b"2"
    store.client.delete(store.keys.tick_leader)
    leader = TickLeader(store, "w1", [NIGHTLY_PATH], lambda line: None, every=1)
    leader.start()
    try:
        wait_for(lambda: store.client.get(fence) == b"3", 15, "a tick past the fence")
        assert leader.leadership == Leadership(leader.holder, 3)
    finally:
        leader.close()


def leader_jobs_name(path: str) -> str:
    """The name of the job at ``path``."""
    from redis_lease.fleet.jobs.job import load_job

    return load_job(path).name


def test_the_leader_thread_outlives_an_error_of_its_own(
    real_store: LeaseStore, nightly: Configure
) -> None:
    """Its line cannot be written (``say`` raises): the thread goes on and ticks."""
    failed: list[str] = []

    def say(line: str) -> None:
        if not failed:
            failed.append(line)
            raise ValueError("the terminal is gone")

    leader = TickLeader(real_store, "w1", [NIGHTLY_PATH], say, every=1)
    leader.start()
    try:
        wait_for(lambda: leader.ticks > 0, 15, "a tick after the error")
        assert failed and leader.is_alive()
    finally:
        leader.close()


def test_a_stuck_tick_gives_the_lease_to_another_worker(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """w1's tick hangs in a planner; past STUCK_PERIODS periods w1 says so and gives the
    lease up, and w2 leads: one hung job no longer stops the fleet's ticks for good."""
    from redis_lease.fleet.tick import leader as leader_module

    monkeypatch.setattr(leader_module, "STUCK_PERIODS", 2)
    leader_jobs.STUCK.clear()
    said: list[str] = []
    first = TickLeader(real_store, "w1", ["tests.leader_jobs:stuck"], said.append, every=1)
    second = TickLeader(real_store, "w2", ["tests.leader_jobs:stuck"], said.append, every=1)
    first.start()
    try:
        wait_for(lambda: first.leadership, 10, "w1 to lead")
        second.start()
        wait_for(lambda: second.leadership, 20, "w2 to lead once w1's tick is stuck")
        assert first.leadership is None
        assert any(line.startswith("worker w1: its tick has run") for line in said), said
        assert any("another worker ticks now" in line for line in said), said
    finally:
        leader_jobs.STUCK.set()
        second.close()
        first.close()


SCHEDULED = "tests.leader_jobs:scheduled"
OTHER = "tests.leader_jobs:other"


def test_the_leader_ticks_a_job_another_worker_declared(real_store: LeaseStore) -> None:
    """w1 is given one job and leads; w2, given that job and another of the same module,
    only declares them: the leader ticks the other job too (it records it, as every tick
    of a job does)."""
    store = real_store
    said: list[str] = []
    leader = TickLeader(store, "w1", [SCHEDULED], said.append, every=1)
    later = TickLeader(store, "w2", [SCHEDULED, OTHER], said.append, every=1)
    leader.start()
    try:
        wait_for(lambda: leader.ticks > 0, 10, "w1 to lead and tick")
        later.start()
        wait_for(
            lambda: store.client.hget(store.keys.job("other"), "path") == OTHER.encode(),
            15,
            "the leader to tick the job w2 declared",
        )
        assert later.leadership is None, "w2 never led"
    finally:
        later.close()
        leader.close()
    assert any("w1" in line and "other" in line for line in said), said


def test_two_processes_of_one_name_never_share_the_lease(real_store: LeaseStore) -> None:
    """A restarted worker beside its paused predecessor, both named 'same': the second gets
    no share of the first's lease, and its release frees nothing of it."""
    store = real_store
    said: list[str] = []
    first = TickLeader(store, "same", [SCHEDULED], said.append, every=1)
    second = TickLeader(store, "same", [SCHEDULED], said.append, every=1)
    try:
        first.step()
        second.step()
        assert first.leadership is not None and first.leadership.token == 1
        assert second.leadership is None, "a second process of the same name leads too"
        second.close()
        holder, token = store.client.hmget(store.keys.tick_leader, ["holder", "token"])
        assert holder and token == b"1", "the second's release freed the first's lease"
        first.step()
        assert first.leadership is not None and first.leadership.token == 1
    finally:
        second.close()
        first.close()
    assert [line for line in said if ": tick leader (token" in line] == [
        f"worker same: tick leader (token 1): ticks {SCHEDULED} every 1s"
    ], said


def test_a_plain_tick_taking_the_lock_midway_stops_that_jobs_tick_not_the_leadership(
    real_store: LeaseStore, nightly: Configure
) -> None:
    """The leader's planning step runs past its lock's time and a plain tick (cron,
    rq-scheduler) takes the job's lock: the leader's tick of the job stops at its next step,
    and nothing in what it returns says it no longer leads."""
    store = real_store
    me = Leadership("w1", hold_leadership(store, "w1", 10_000).token)
    lock_key = store.keys.job_tick_lock("nightly")
    taken: list[bool] = []

    def plain_tick_takes_the_lock(run_id: str, planned: int) -> None:
        if not taken:  # the leader's lock ran out (its 60 s) and a plain tick's SET NX won
            store.client.delete(lock_key)
            taken.append(bool(store.client.set(lock_key, "plain-tick", nx=True, px=60_000)))

    made = tick(store, [NIGHTLY_PATH], now=T0, progress=plain_tick_takes_the_lock, leader=me)
    kinds = [d.kind for d in made]
    assert taken == [True]
    assert NOT_LEADER not in kinds, kinds
    assert kinds[0] == "create" and "plan" in kinds, kinds
    assert store.client.get(lock_key) == b"plain-tick", "the plain tick's lock is left alone"
    assert still_leading(store, me), "the lease is still the leader's"


def test_a_plain_tick_beside_the_leader_changes_nothing_about_who_leads(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch, queue_name: str
) -> None:
    """The leader's tick hangs in a planner past its lock's time (1 s here); a plain tick
    takes the job's lock meanwhile. The leader goes on leading with its token: it neither
    says it lost the lead nor asks for a new token."""
    from dataclasses import replace

    from redis_lease.fleet.tick import scheduler_tick
    from tests.fleet_helpers import purge_queue

    store = real_store
    monkeypatch.setattr(scheduler_tick, "TICK_LOCK_SECONDS", 1)
    job = leader_jobs.stuck
    monkeypatch.setattr(job, "options", replace(job.options, queue=queue_name))
    leader_jobs.STUCK.clear()
    said: list[str] = []
    leader = TickLeader(store, "w1", ["tests.leader_jobs:stuck"], said.append, every=1)
    lock_key = store.keys.job_tick_lock("stuck")
    leader.start()
    try:
        wait_for(lambda: leader.leadership, 10, "w1 to lead")
        wait_for(  # its tick hangs in the planner; once its lock ran out, a plain tick's
            lambda: store.client.set(lock_key, "plain-tick", nx=True, px=60_000),
            10,
            "the leader's lock to run out and a plain tick to take it",
        )
        leader_jobs.STUCK.set()
        wait_for(lambda: leader.ticks > 0, 10, "the leader's tick to end")
        renewed = store.client.hget(store.keys.tick_leader, "expires")
        for _ in range(2):  # two renewals after its tick ended
            wait_for(
                lambda before=renewed: (
                    store.client.hget(store.keys.tick_leader, "expires") != before
                ),
                10,
                "a renewal",
            )
            renewed = store.client.hget(store.keys.tick_leader, "expires")
        assert store.client.hget(store.keys.tick_leader, "token") == b"1"
        assert leader.leadership is not None and leader.leadership.token == 1
        assert not any("no longer the tick leader" in line for line in said), said
        assert not any("token 2" in line for line in said), said
    finally:
        leader_jobs.STUCK.set()
        leader.close()
        purge_queue(store.client, queue_name)


def test_run_worker_from_python_refuses_a_protocol_it_does_not_speak(
    real_store: LeaseStore, queue_name: str
) -> None:
    """As the command line does: one line naming the protocol, and nothing written."""
    from redis_lease.errors import ProtocolMismatch

    store = real_store
    store.client.set(store.keys.protocol, "99")
    lines: list[str] = []
    with pytest.raises(ProtocolMismatch, match=r"is in protocol 99") as refused:
        run_worker(
            jobs=[leader_jobs.scheduled],
            url=store.url,
            prefix=store.prefix,
            queues=[queue_name],
            burst=True,
            simple=True,
            say=lines.append,
        )
    assert refused.value.exit_code == 9
    assert keys_under(store.client, store.prefix) == [store.keys.protocol], "it wrote"
    assert lines == []


def test_a_declared_job_the_leader_did_not_load_is_named_not_imported(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """w2 declares a job of a module the leader had not loaded when it started (a rolling
    deploy that adds it): the leader imports nothing for it, does not tick it, and names it
    in its log, beside its lease (workers, metrics) and in w2's log."""
    import sys

    from redis_lease.protocol.store.declared_jobs import declared_jobs

    store = real_store
    weekly = "tests.declared_jobs:weekly"
    monkeypatch.delitem(sys.modules, "tests.declared_jobs", raising=False)
    said: list[str] = []
    leader = TickLeader(store, "w1", [SCHEDULED], said.append, every=1)
    later = TickLeader(store, "w2", [SCHEDULED, weekly], said.append, every=1)  # imports it
    leader.start()
    try:
        wait_for(lambda: leader.ticks > 0, 10, "w1 to lead and tick")
        later.start()
        wait_for(
            lambda: (
                [j.ticked for j in declared_jobs(store).jobs.values() if j.job == "weekly"]
                == [False]
            ),
            15,
            "the leader to name the job it cannot tick",
        )
        wait_for(lambda: any(line.startswith("worker w2: job weekly") for line in said), 5, "w2")
    finally:
        later.close()
        leader.close()
    reason = (
        "its module 'tests.declared_jobs' was not loaded in the leader when it started, and a "
        "leader imports no module another worker names: give every worker the same --job options"
    )
    assert (
        f"worker w1: job weekly ({weekly}), declared by worker w2, is not ticked: {reason}" in said
    )
    assert (
        f"worker w2: job weekly ({weekly}), which this worker declared, is not ticked: the tick "
        f"leader w1: {reason}"
    ) in said
    assert store.client.exists(store.keys.job("weekly")) == 0, "the leader ticked it"
    assert "weekly" not in declared_jobs(store).jobs, "w2 withdrew its jobs when it stopped"


class _Recording(TickLeader):
    """A leader that notes where each leadership begins, and whether it was continuous."""

    begun: list[tuple[int, bool]]

    def _begin(self, leadership: Leadership, continuous: bool) -> None:
        self.begun.append((leadership.token, continuous))
        super()._begin(leadership, continuous)


def test_a_new_leadership_says_whether_the_lease_was_held_without_a_break(
    real_store: LeaseStore,
) -> None:
    """Its first leadership is not continuous; one begun on a token past a job's fence while
    it still held the lease is; one begun after another worker held the lease is not."""
    store = real_store
    said: list[str] = []
    leader = _Recording(store, "w1", [SCHEDULED], said.append, every=1)
    leader.begun = []
    store.client.set(store.keys.job_tick_fence("scheduled"), 4)  # the lease's hash was lost
    try:
        leader.step()  # token 1: its tick meets the fence and asks for a token past it
        wait_for(lambda: leader.leadership is None, 10, "the tick to meet the fence")
        leader.step()
        assert leader.begun == [(1, False), (5, True)]
        release_leadership(store, leader.holder)
        assert hold_leadership(store, "another#1", 10_000).held
        leader.step()  # another holds it
        assert leader.leadership is None
        release_leadership(store, "another#1")
        leader.step()
        assert leader.begun == [(1, False), (5, True), (7, False)]
    finally:
        leader.close()


def test_a_declaring_worker_says_when_its_job_is_not_ticked_and_when_it_is_again(
    real_store: LeaseStore,
) -> None:
    """The leader (another process, here its writes) names w2's job, then no longer does."""
    from redis_lease.protocol.store.declared_jobs import Unticked, unticked_text
    from redis_lease.protocol.store.leader import process_holder

    store = real_store
    leader = process_holder("w1")
    token = hold_leadership(store, leader, 10_000).token
    said: list[str] = []
    worker = TickLeader(store, "w2", [SCHEDULED], said.append, every=1)
    named = [Unticked("scheduled", SCHEDULED, ("w2",), "not in its code")]
    try:
        hold_leadership(store, leader, 10_000, unticked=unticked_text(leader, token, named))
        worker.step()
        worker.step()  # said once
        hold_leadership(store, leader, 10_000, unticked=unticked_text(leader, token, []))
        worker.step()
        release_leadership(store, leader)
        worker.step()  # no leader: nothing said of its jobs (it leads now, and ticks them)
    finally:
        worker.close()
    assert [line for line in said if "job scheduled" in line] == [
        f"worker w2: job scheduled ({SCHEDULED}), which this worker declared, is not ticked: "
        "the tick leader w1: not in its code",
        "worker w2: job scheduled, which this worker declared, is ticked now",
    ]


class _NotTicking(TickLeader):
    """A leader whose ticks do nothing: what it remembers is the test's to set."""

    def _tick(self, leadership: Leadership) -> None:
        return None


def test_a_leadership_begun_after_a_break_doubts_what_the_process_remembers(
    real_store: LeaseStore,
) -> None:
    """Another leader may have ticked during the break: the runs this process remembers are
    doubtful (after a loss they are named lost, not made again). A lease whose hash was lost
    (a wipe) and taken again at once by its holder is no break: its memory is the witness
    of what the wipe took."""
    store, run_id = real_store, "scheduled:2026-01-02"
    mark = Remembered("mark", 0, 1, {run_id: ("scheduled", 1)})
    leader = _NotTicking(store, "w1", [SCHEDULED], lambda line: None, every=1)
    store.client.hset(store.keys.tick_leader, mapping={"holder": "", "token": 2, "expires": 0})
    try:
        keep(store, mark)
        leader.step()  # its first leadership, token 3
        first = recall(store)
        assert first is not None and first.state_of(run_id) == DOUBTFUL
        keep(store, mark)
        store.client.delete(store.keys.tick_leader)  # lost with everything else
        leader.step()
        again = recall(store)
        assert leader.leadership is not None and leader.leadership.token == 1  # gone back
        assert again is not None and again.state_of(run_id) == OPEN
        release_leadership(store, leader.holder)
        assert hold_leadership(store, "another#1", 10_000).held
        leader.step()  # another holds it
        release_leadership(store, "another#1")
        leader.step()
        after = recall(store)
        assert after is not None and after.state_of(run_id) == DOUBTFUL
    finally:
        leader.close()


def test_a_token_two_past_its_own_is_a_break_another_held_the_lease_between(
    real_store: LeaseStore,
) -> None:
    """Each new holder adds one to the token. A leader whose hold finds its token two past
    its own did not see another worker that took the lease and let it go between its tries:
    that leadership is not continuous."""
    store = real_store
    leader = _Recording(store, "w1", [SCHEDULED], lambda line: None, every=60)
    leader.begun = []
    try:
        leader.step()
        token = leader.begun[-1][0]
        store.client.hset(  # another took the lease after it ran out, and let it go
            store.keys.tick_leader, mapping={"holder": "", "token": token + 1, "expires": 0}
        )
        leader.step()
        assert leader.begun[-1] == (token + 2, False)
    finally:
        leader.close()
