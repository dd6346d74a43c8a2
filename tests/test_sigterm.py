"""A worker sent SIGTERM mid-shard finishes its current item, gives back the items it had
claimed but not started (claimable at once, no waiting for their leases to expire) and
exits well within the lease TTL: with ``--simple`` and with RQ's forking worker.
"""

from __future__ import annotations

import importlib
import os
import signal
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

from redis_lease import LeaseStore
from redis_lease.dispatch import enqueue_shard
from redis_lease.lease import Lease
from redis_lease.runs import Runs
from tests import fleet_jobs
from tests.fleet_helpers import (
    FLEET_PATH,
    Processes,
    all_records,
    fleet_env,
    leased_by,
    owner_pid,
    pid_alive,
    purge_queue,
    text,
    wait_for,
)

pytestmark = pytest.mark.slow

TTL = 6.0
#: Per item: the items after the slow one outlast the lease keeper's poll (TTL / 3).
DELAY = 0.25
ITEMS = 40
SLOW = fleet_jobs.item_id(2)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """The test's processes; every one is killed at teardown."""
    processes = Processes(tmp_path)
    yield processes
    processes.kill_all()


@pytest.fixture
def queue_name(real_store: LeaseStore) -> Iterator[str]:
    """An RQ queue of this test's own, deleted with its jobs afterwards."""
    name = f"{real_store.prefix}-q"
    yield name
    purge_queue(real_store.client, name)


@pytest.mark.parametrize("simple", [True, False], ids=["simple-worker", "forking-worker"])
def test_sigterm_drains_the_shard_and_releases_unstarted_items(
    real_store: LeaseStore,
    redis_url: str,
    queue_name: str,
    procs: Processes,
    monkeypatch: pytest.MonkeyPatch,
    simple: bool,
) -> None:
    env = fleet_env(
        queue_name, items=ITEMS, shards=1, ttl=TTL, batch=20, delay=DELAY,
        slow_item=SLOW, slow_seconds=1.0,
    )  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    job = importlib.reload(fleet_jobs).fleet
    prefix = real_store.prefix
    try:
        runs = Runs(real_store)
        run_id, _ = runs.ensure(job, date(2031, 6, 1), runs.server_now())
        assert runs.plan(job, run_id) == ITEMS
        worker = procs.worker(redis_url, queue_name, env, simple=simple, name="worker")
        enqueue_shard(real_store, FLEET_PATH, queue_name, run_id, 0, job.options.shard_budget)

        started = fleet_jobs.started_key(real_store.prefix, SLOW)
        horse = int(wait_for(lambda: real_store.client.lindex(started, 0), 60, "the slow item"))
        procs.extra_pids.add(horse)  # a forking worker's work horse is in its own group
        assert (horse == worker.pid) is simple
        held = leased_by(real_store, run_id)
        assert held.get(SLOW) == horse
        # Handled items wait, still leased, for their batch's commit: the unstarted ones are
        # the leased items whose handler never ran (no effect recorded).
        handled = {text(k) for k in real_store.client.hkeys(fleet_jobs.effects_key(prefix))}
        unstarted = {item for item, pid in held.items() if pid == horse and item not in handled}
        assert unstarted, "the worker had claimed items it had not started"
        leases_until = min(real_store.item(run_id, item).expires_at_ms or 0 for item in unstarted)

        sent = time.monotonic()
        os.kill(worker.pid, signal.SIGTERM)
        worker.wait(timeout=TTL + 5)
        took = time.monotonic() - sent
        assert took < TTL, f"worker took {took:.1f}s to exit; lease TTL is {TTL}s"
        assert worker.returncode == 0, procs.log("worker")
        wait_for(lambda: not pid_alive(horse), 5, "the work horse to end")

        record = real_store.item(run_id, SLOW)
        assert record.state == "done", "the current item was finished"
        assert owner_pid(record.owner) == horse
        status = real_store.status(run_id)
        assert status.counts["leased"] == 0, "every claimed item was committed or given back"
        handled = {text(k) for k in real_store.client.hkeys(fleet_jobs.effects_key(prefix))}
        done = {r.item_id for r in all_records(real_store, run_id) if r.state == "done"}
        assert done == handled, "every item started was finished and committed"
        released = unstarted - handled
        if simple:  # the signal reaches the job at once: it stops after the current item
            assert released == unstarted
        else:  # the lease keeper sees the worker's shutdown request within TTL / 3
            assert released, "the work horse stopped before it ran out of claimed items"
        pending = {r.item_id for r in all_records(real_store, run_id) if r.state == "pending"}
        assert released <= pending
        assert status.events["releases"] >= len(released)
        now_ms = int(runs.server_now().timestamp() * 1000)
        assert now_ms < leases_until, "checked before the old leases would have expired"
        for item in sorted(released):
            lease: Lease = real_store.claim(run_id, item, worker="after-sigterm", ttl=30)
            assert lease.token == real_store.item(run_id, item).token
            assert not lease.takeover, f"{item} was released, not taken over after expiry"
        assert status.events.get("takeovers", 0) == 0
    finally:
        monkeypatch.undo()
        importlib.reload(fleet_jobs)
