"""A worker sent SIGTERM mid-shard finishes its current item, gives back the items it had
claimed but not started (claimable at once, no waiting for their leases to expire) and
exits: with ``--simple`` and with RQ's forking worker.

The test steps on events, never on guessed times: the slow item's handler waits for
the test's word, so the worker's claims are read while it is known to be inside that
item; the word comes once the worker has the stop request (the forking worker's work
horse learns of it from its lease keeper, which checks after each renewal of the
leases). Worker processes import :data:`sigterm_job` from this module by path;
``SIGTERM_QUEUE`` names its RQ queue there.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import pytest
import redis

from redis_lease import LeaseStore
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport.shard_jobs import enqueue_shard
from redis_lease.fleet.worker.shard_job import ActiveLease
from redis_lease.protocol.leases import Item, Lease
from tests.fleet_helpers import (
    Processes,
    all_records,
    leased_by,
    owner_pid,
    pid_alive,
    text,
    wait_for,
)
from tests.helpers import server_ms

pytestmark = pytest.mark.slow

JOB_PATH = f"{__name__}:sigterm_job"
TTL = 3.0
ITEMS = 40
SLOW = "item-002"
#: The longest the slow item waits for the test's word (more than the test's own waits
#: before it gives the word), in blocking reads of :data:`GATE_READ` seconds each (under
#: the client's socket timeout).
GATE_SECONDS = 120
GATE_READ = 10

sigterm_job = Job(
    "sigterm",
    shards=1,
    lease_ttl_seconds=TTL,
    batch_size=20,
    shard_budget_seconds=120,
    max_attempts=10,
    deadline_after=timedelta(minutes=10),
    schedule="0 0 29 2 *",  # 29 February only: nothing falls due by itself
    queue=os.environ.get("SIGTERM_QUEUE", "rltest-sigterm"),
)


def handled_key(prefix: str) -> str:
    """The hash of handler starts per item id."""
    return f"{prefix}:sigterm:handled"


def started_key(prefix: str) -> str:
    """The list of process ids that started the slow item."""
    return f"{prefix}:sigterm:started"


def gate_key(prefix: str) -> str:
    """The list the slow item waits on for the test's word."""
    return f"{prefix}:sigterm:go"


@sigterm_job.planner
def plan(business_date: date) -> Iterator[Item]:
    """``ITEMS`` items."""
    for n in range(ITEMS):
        yield Item(f"item-{n:03d}", {"n": n})


@sigterm_job.handler
def handle(item: Item, lease: ActiveLease) -> dict[str, Any]:
    """Counts its start; the slow item records its process and waits for the test's word.

    Answers with its process and the token it ran under.
    """
    client, prefix = lease.store.client, lease.store.prefix
    client.hincrby(handled_key(prefix), item.id, 1)
    if item.id == SLOW:
        client.rpush(started_key(prefix), os.getpid())
        ends = time.monotonic() + GATE_SECONDS
        while client.blpop([gate_key(prefix)], timeout=GATE_READ) is None:
            if time.monotonic() > ends:
                raise RuntimeError("the test never let the slow item go")
    return {"pid": os.getpid(), "token": lease.token}


def handled(store: LeaseStore) -> set[str]:
    """Items whose handler started."""
    return {text(k) for k in store.client.hkeys(handled_key(store.prefix))}


def shutdown_requested(client: redis.Redis, queue: str) -> bool:
    """True once an RQ worker of ``queue`` recorded a warm shutdown request."""
    workers = client.smembers(f"rq:workers:{queue}")
    return any(client.hget(text(key), "shutdown_requested_date") for key in workers)


def wait_for_renewals(store: LeaseStore, run_id: str, item: str, count: int) -> None:
    """Waits until the lease keeper has renewed ``item``'s lease ``count`` times from now on.

    A renewal moves the lease's expiry to the server's time then plus the TTL.
    """
    since = server_ms(store.client)
    for _ in range(count):

        def renewed(after: int = since) -> int | None:
            expires = store.item(run_id, item).expires_at_ms or 0
            return expires if expires > after + TTL * 1000 else None

        since = wait_for(renewed, 5 * TTL, f"a renewal of {item}'s lease") - int(TTL * 1000)


@pytest.mark.parametrize("simple", [True, False], ids=["simple-worker", "forking-worker"])
def test_sigterm_drains_the_shard_and_releases_unstarted_items(
    real_store: LeaseStore, redis_url: str, queue_name: str, procs: Processes, simple: bool
) -> None:
    store, client, prefix = real_store, real_store.client, real_store.prefix
    runs = Runs(store)
    run_id, _ = runs.ensure(sigterm_job, date(2031, 6, 1), runs.server_now())
    assert runs.plan(sigterm_job, run_id) == ITEMS
    env = {"SIGTERM_QUEUE": queue_name}
    worker = procs.worker(redis_url, queue_name, env, simple=simple, name="worker")
    enqueue_shard(store, JOB_PATH, queue_name, run_id, 0, sigterm_job.options.shard_budget_seconds)

    horse = int(text(wait_for(lambda: client.lindex(started_key(prefix), 0), 60, "the slow item")))
    procs.extra_pids.add(horse)  # a forking worker's work horse is in its own group
    assert (horse == worker.pid) is simple
    # The horse waits inside the slow item: its claims hold still while they are read.
    held = leased_by(store, run_id)
    assert held.get(SLOW) == horse
    # Handled items wait, still leased, for their batch's commit: the unstarted ones are
    # the leased items whose handler never ran.
    unstarted = {item for item, pid in held.items() if pid == horse and item not in handled(store)}
    assert unstarted, "the worker had claimed items it had not started"
    tokens = {item: store.item(run_id, item).token for item in unstarted | {SLOW}}

    os.kill(worker.pid, signal.SIGTERM)
    wait_for(lambda: shutdown_requested(client, queue_name), 10, "the shutdown request")
    if not simple:  # the keeper reads the request after a renewal: one more, and it has
        wait_for_renewals(store, run_id, min(unstarted), 2)
    client.rpush(gate_key(prefix), "go")
    worker.wait(timeout=60)
    assert worker.returncode == 0, procs.log("worker")
    wait_for(lambda: not pid_alive(horse), 5, "the work horse to end")

    record = store.item(run_id, SLOW)
    assert record.state == "done", "the current item was finished"
    assert owner_pid(record.owner) == horse
    assert record.result == {"pid": horse, "token": tokens[SLOW]}, "under the lease it held"
    assert record.token == tokens[SLOW]
    status = store.status(run_id)
    assert status.counts["leased"] == 0, "every claimed item was committed or given back"
    started = handled(store)
    done = {r.item_id for r in all_records(store, run_id) if r.state == "done"}
    assert done == started, "every item started was finished and committed"
    assert not unstarted & started, "nothing was started after the stop request"
    pending = {r.item_id for r in all_records(store, run_id) if r.state == "pending"}
    assert unstarted <= pending
    assert status.counters["releases"] == len(unstarted)
    for item in sorted(unstarted):
        assert store.item(run_id, item).token == tokens[item], "given back, not taken"
        lease: Lease = store.claim(run_id, item, worker="after-sigterm", ttl=30)
        assert lease.token == tokens[item] + 1
        assert not lease.takeover, f"{item} was released, not taken over after expiry"
    assert status.counters.get("takeovers", 0) == 0
