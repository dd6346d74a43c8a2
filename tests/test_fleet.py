"""End to end on real Redis with real RQ worker processes: every item done exactly once,
nothing lost when a worker is killed, a paused worker's late commit refused.
"""

from __future__ import annotations

import importlib
import os
import signal
from collections.abc import Callable, Iterator
from datetime import date

import pytest

from redis_lease import LeaseStore
from redis_lease.fleet.runs.lifecycle import Runs
from tests import fleet_jobs
from tests.fleet_helpers import (
    FLEET_PATH,
    Processes,
    all_records,
    drive,
    fleet_env,
    leased_by,
    pid_alive,
    stop_group,
    text,
    wait_for,
)

pytestmark = pytest.mark.slow

BUSINESS_DATE = date(2031, 5, 17)


@pytest.fixture
def configure(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[dict[str, str]], None]]:
    """Sets the fleet job's environment here too and re-imports it (options are fixed at
    import); the defaults come back afterwards."""

    def apply(env: dict[str, str]) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        importlib.reload(fleet_jobs)

    yield apply
    monkeypatch.undo()
    importlib.reload(fleet_jobs)


def start_run(store: LeaseStore) -> str:
    """Creates the fleet job's run for the test date (the tick plans and dispatches it)."""
    runs = Runs(store)
    run_id, created = runs.ensure(fleet_jobs.fleet, BUSINESS_DATE, runs.server_now())
    assert created
    return run_id


def effects(store: LeaseStore) -> dict[str, int]:
    """Effect counts per item id, as the handler recorded them."""
    raw = store.client.hgetall(fleet_jobs.effects_key(store.prefix))
    return {text(k): int(v) for k, v in raw.items()}


def assert_all_done_once(store: LeaseStore, run_id: str, items: int) -> None:
    """Every item done, with exactly one successful commit each, by its last holder."""
    status = store.status(run_id)
    assert status.total == items
    assert status.counts == {"pending": 0, "leased": 0, "done": items, "dead": 0}
    assert status.counters["commits"] == items
    records = list(all_records(store, run_id))
    assert sorted(r.item_id for r in records) == [fleet_jobs.item_id(n) for n in range(items)]
    for record in records:
        assert record.state == "done"
        assert record.result["token"] == record.token, record


def test_run_over_several_shards_completes_exactly_once(
    real_store: LeaseStore,
    redis_url: str,
    queue_name: str,
    procs: Processes,
    configure: Callable[[dict[str, str]], None],
) -> None:
    items = 300
    env = fleet_env(queue_name, items=items, shards=6, ttl=5, batch=10, delay=0.002)
    for n in range(3):
        procs.worker(redis_url, queue_name, env, name=f"worker-{n}")
    configure(env)  # the ticking test process must see the same job settings
    run_id = start_run(real_store)
    state = drive(real_store, FLEET_PATH, run_id, timeout=60)
    assert state == "succeeded", Runs(real_store).info(run_id)
    assert_all_done_once(real_store, run_id, items)
    assert effects(real_store) == {fleet_jobs.item_id(n): 1 for n in range(items)}
    workers = {r.result["pid"] for r in all_records(real_store, run_id)}
    assert workers <= {p.pid for p in procs.started}
    assert len(workers) >= 2, "several workers shared the run"
    assert real_store.status(run_id).counters.get("stale_commits", 0) == 0


def _slow_starts(store: LeaseStore, item: str) -> list[int]:
    return [int(p) for p in store.client.lrange(fleet_jobs.started_key(store.prefix, item), 0, -1)]


def test_worker_killed_midway_loses_nothing(
    real_store: LeaseStore,
    redis_url: str,
    queue_name: str,
    procs: Processes,
    configure: Callable[[dict[str, str]], None],
) -> None:
    items, slow = 240, fleet_jobs.item_id(37)
    env = fleet_env(
        queue_name, items=items, shards=4, ttl=4, batch=10, delay=0.005,
        slow_item=slow, slow_seconds=0.2, slow_hold=1,
    )  # fmt: skip
    workers = [procs.worker(redis_url, queue_name, env, name=f"worker-{n}") for n in range(3)]
    configure(env)
    run_id = start_run(real_store)
    shard = real_store.shard_for(run_id, slow)

    started = fleet_jobs.started_key(real_store.prefix, slow)

    def victim() -> int | None:
        drive_once(real_store, run_id)
        # Returns as soon as the slow item's first start is recorded (and keeps the list).
        first = real_store.client.blmove(started, started, 1, "LEFT", "RIGHT")
        return int(first) if first else None

    # The victim waits inside the slow item (its first start is held) until it is killed.
    pid = wait_for(victim, 60, "a worker to start the slow item", every=0)
    assert pid in {w.pid for w in workers}
    # Every worker frozen, no one can claim: the victim's leases are read as they were when
    # it stopped; none can change hands first, however long the read takes (a lease that
    # ran out is only taken over by a claim).
    for worker in workers:
        stop_group(worker.pid)
    held = leased_by(real_store, run_id)
    events = real_store.status(run_id).counters
    assert events.get("takeovers", 0) == events.get("expired", 0) == 0, "no lease lost before"
    assert held.get(slow) == pid, "stopped inside the slow item"
    os.killpg(pid, signal.SIGKILL)
    for worker in workers:
        if worker.pid != pid:
            os.killpg(worker.pid, signal.SIGCONT)
    wait_for(lambda: not pid_alive(pid), 10, "the killed worker to end")
    killed_items = {item for item, holder in held.items() if holder == pid}
    state = drive(real_store, FLEET_PATH, run_id, timeout=90)
    assert state == "succeeded", Runs(real_store).info(run_id)
    assert_all_done_once(real_store, run_id, items)
    records = {r.item_id: r for r in all_records(real_store, run_id)}
    for item in killed_items:  # the killed worker's leases were taken over and finished
        assert records[item].result["pid"] != pid
        assert records[item].token >= 2
    shard_items = [r for r in records.values() if r.shard == shard]
    assert all(r.state == "done" for r in shard_items)
    assert real_store.status(run_id).counters["takeovers"] >= 1
    counts = effects(real_store)
    assert set(counts) == set(records)
    assert counts[slow] == 2  # started by the killed worker, done by another
    # Only the items the killed worker held can have had a second effect.
    assert {item for item, n in counts.items() if n > 1} <= killed_items


def drive_once(store: LeaseStore, run_id: str) -> None:
    """One tick of the fleet job (plans, dispatches and re-dispatches abandoned shards)."""
    from redis_lease.fleet.tick.scheduler_tick import tick

    tick(store, [FLEET_PATH])


def test_paused_worker_late_commit_is_refused(
    real_store: LeaseStore,
    redis_url: str,
    queue_name: str,
    procs: Processes,
    configure: Callable[[dict[str, str]], None],
) -> None:
    items, slow = 200, fleet_jobs.item_id(11)
    env = fleet_env(
        queue_name, items=items, shards=4, ttl=2, batch=10, delay=0.005,
        slow_item=slow, slow_seconds=0.2, slow_hold=1,
    )  # fmt: skip
    for n in range(3):
        procs.worker(redis_url, queue_name, env, name=f"worker-{n}")
    configure(env)
    run_id = start_run(real_store)

    def paused() -> int | None:
        drive_once(real_store, run_id)
        starts = _slow_starts(real_store, slow)
        return starts[0] if starts else None

    # The first start waits inside the slow item until the test releases it, after the
    # takeover: its commit comes late whatever the machine's speed.
    pid = wait_for(paused, 60, "a worker to start the slow item", every=0.1)
    stop_group(pid)
    try:
        token = real_store.item(run_id, slow).token

        def taken_over() -> bool:
            drive_once(real_store, run_id)
            record = real_store.item(run_id, slow)
            return record.token > token and len(_slow_starts(real_store, slow)) >= 2

        wait_for(taken_over, 60, "another worker to take the slow item over", every=0.1)
    finally:
        fleet_jobs.release_slow(real_store.client, real_store.prefix, slow)
        os.killpg(pid, signal.SIGCONT)

    def refused() -> int:
        drive_once(real_store, run_id)
        return real_store.status(run_id).counters.get("stale_commits", 0)

    wait_for(refused, 30, "the paused worker's commit to be refused", every=0.1)
    state = drive(real_store, FLEET_PATH, run_id, timeout=90)
    assert state == "succeeded", Runs(real_store).info(run_id)
    assert_all_done_once(real_store, run_id, items)
    status = real_store.status(run_id)
    assert status.counters["stale_commits"] >= 1
    assert status.counters["takeovers"] >= 1
    record = real_store.item(run_id, slow)
    assert record.result["pid"] != pid, "the paused worker's result was not stored"
    assert record.token > token
    assert effects(real_store)[slow] == 2
