"""The world the dashboard shows in the browser tests, made on a private Redis by real
worker processes: a finished settlement run with done and dead items, its decision log
and its age history, and a held run whose worker stays busy until released.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from redis_lease import LeaseStore
from redis_lease.fleet.runs import run_ages
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.scheduler_tick import tick
from tests.browser import jobs
from tests.fleet_helpers import Processes, drive, wait_for
from tests.redis_server import RedisServer

PREFIX = "dash"
#: The age history's least interval while the scenario runs: the run lasts seconds, not
#: hours, and each tick should add a point to the chart.
SAMPLE_INTERVAL_MS = 200
#: The eligible age the run's items reach before any worker starts.
QUEUED_AGE = 1.5


@dataclass(frozen=True)
class World:
    """The private Redis, the store on it and the runs made."""

    redis_url: str
    store: LeaseStore
    procs: Processes
    settlement_run: str
    dead_items: list[str]


@contextmanager
def private_world(directory: Path) -> Iterator[World]:
    """A private redis-server with a finished settlement run; everything ends afterwards."""
    server = RedisServer(directory)
    server.start()
    procs = Processes(directory)
    store = LeaseStore.from_url(server.url, prefix=PREFIX)
    try:
        run_id = settle(store, server.url, procs)
        dead = [jobs.account(n) for n in range(jobs.ACCOUNTS) if jobs.refused(n)]
        yield World(server.url, store, procs, run_id, dead)
    finally:
        store.client.set(jobs.release_key(PREFIX), 1)
        procs.kill_all()
        store.client.close()
        server.kill()


def settle(store: LeaseStore, redis_url: str, procs: Processes) -> str:
    """Runs the settlement job to its end: planned by ticks, worked by three workers."""
    runs = Runs(store)
    run_id, created = runs.ensure(jobs.settlement, runs.server_now().date(), runs.server_now())
    assert created, run_id
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_ages, "MIN_INTERVAL_MS", SAMPLE_INTERVAL_MS)

        def queued() -> bool:  # ticks plan and dispatch; the items wait with no worker yet
            tick(store, [jobs.SETTLEMENT_PATH])
            return store.status(run_id).oldest_eligible_age_seconds >= QUEUED_AGE

        wait_for(queued, 30, "the planned items to wait", every=0.25)
        for n in range(3):
            procs.worker(redis_url, jobs.settlement.options.queue, {}, name=f"settle-{n}")
        state = drive(store, jobs.SETTLEMENT_PATH, run_id, timeout=90)
    assert state == "partial", (state, runs.info(run_id))
    return run_id


def hold_a_worker(world: World) -> str:
    """Starts the held run and its worker; returns the run id once the worker is busy."""
    store = world.store
    runs = Runs(store)
    run_id, _ = runs.ensure(jobs.hold, runs.server_now().date(), runs.server_now())
    tick(store, [jobs.HOLD_PATH])
    world.procs.worker(world.redis_url, jobs.hold.options.queue, {}, name="hold")

    def busy() -> bool:
        tick(store, [jobs.HOLD_PATH])
        return store.status(run_id).counts["leased"] == 1

    wait_for(busy, 60, "the held item to be leased", every=0.2)
    return run_id
