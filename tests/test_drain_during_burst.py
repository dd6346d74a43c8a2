"""A worker drained during a burst: the oldest eligible age rises, then falls back.

Items arrive at a steady rate that 2 worker processes keep up with and 1 does not.
Midway one worker gets SIGTERM: it finishes its item, gives back what it claimed
and leaves. The test samples ``store.status(run).oldest_eligible_age_seconds``
while it feeds the items and keeps shard jobs dispatched: the age rises after the
drain and falls back to 0 once the arrivals stop and the other worker catches up.
Some items fail their first attempt and are retried: the retries show in the
delivery attempts (``claims``) and not in the transitions (``commits``, the items
``done``), in the store's counters and in the Prometheus text alike.

Worker processes import :data:`drain_job` from this module by path;
``DRAIN_QUEUE`` names their RQ queue.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import date, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redis_lease import LeaseStore
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport import shard_jobs
from redis_lease.fleet.worker.shard_job import ActiveLease
from redis_lease.operate.metrics.collector import LeaseCollector
from redis_lease.protocol.leases import Item
from redis_lease.protocol.store import run_status
from tests.fleet_helpers import Processes, all_records, leased_by, wait_for

pytestmark = pytest.mark.slow

DRAIN_PATH = f"{__name__}:drain_job"
#: Each worker handles one item at a time, each in about this many seconds (20/s at most).
HANDLER_SECONDS = 0.05
#: Arrivals per second: under 2 workers' rate, over 1 worker's.
ARRIVALS_PER_S = 24
FEED_SECONDS = 6.0
DRAIN_AT = 2.0
ITEMS = int(ARRIVALS_PER_S * FEED_SECONDS)
SHARDS = 4
#: Every FAIL_EVERY-th item fails its first attempt (a retry).
FAIL_EVERY = 6

drain_job = Job(
    "drain-burst",
    shards=SHARDS,
    lease_ttl_seconds=10,
    # One item per claim: an item waiting for a worker stays eligible, not leased in a batch.
    batch_size=1,
    commit_interval_seconds=0,
    max_attempts=5,
    backoff_base_seconds=0.1,
    backoff_cap_seconds=0.2,
    # Short passes: shard jobs rotate over the workers, and the drained one's shards move on.
    shard_budget_seconds=1.0,
    deadline_after=timedelta(minutes=10),
    schedule="0 0 29 2 *",  # 29 February only: nothing falls due by itself
    queue=os.environ.get("DRAIN_QUEUE", "rltest-drain"),
)


@drain_job.planner
def plan(business_date: date) -> Iterator[Item]:
    """Plans nothing: the test feeds the items over the burst."""
    return iter(())


class FirstAttemptFails(Exception):
    """A planned failure: the item is retried after its backoff."""


def fails_first(n: int) -> bool:
    """True for the items whose first attempt fails."""
    return n % FAIL_EVERY == 0


@drain_job.handler
def handle(item: Item, lease: ActiveLease) -> int:
    """Sleeps; the planned items fail their first attempt."""
    time.sleep(HANDLER_SECONDS)
    if fails_first(int(item.payload["n"])) and lease.lease.attempt == 1:
        raise FirstAttemptFails(f"{item.id}: first attempt fails")
    return int(item.payload["n"])


def dispatch_due(store: LeaseStore, run_id: str, queue: str) -> None:
    """Enqueues a shard job on ``queue`` for each shard with due or leased items and no
    live job."""
    _, shards = run_status.read(store, run_id)
    wanted = [
        shard
        for shard, snap in enumerate(shards)
        if (snap.first_due_ms is not None and snap.first_due_ms <= snap.now_ms)
        or snap.counts["leased"]
    ]
    if not wanted:
        return
    live = shard_jobs.live_jobs(store, run_id)
    budget = drain_job.options.shard_budget_seconds
    for shard in wanted:
        if not live.get(shard):
            shard_jobs.enqueue_shard(store, DRAIN_PATH, queue, run_id, shard, budget)


def metrics_of(store: LeaseStore, run_id: str) -> dict[str, float]:
    """The run's samples in the Prometheus text, by sample name (and state, for items)."""
    registry = CollectorRegistry()
    registry.register(LeaseCollector(store))
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.labels.get("run") != run_id:
                continue
            state = sample.labels.get("state")
            found[f"{sample.name}:{state}" if state else sample.name] = sample.value
    return found


def test_a_drained_worker_raises_the_oldest_eligible_age_and_retries_count_as_attempts(
    real_store: LeaseStore, redis_url: str, queue_name: str, procs: Processes
) -> None:
    store, runs = real_store, Runs(real_store)
    run_id, _ = runs.ensure(drain_job, date(2031, 8, 1), runs.server_now())
    env = {"DRAIN_QUEUE": queue_name}
    workers = [procs.worker(redis_url, queue_name, env, name=f"w{n}") for n in range(2)]
    workers_key = f"rq:workers:{queue_name}"  # both up before the burst starts
    wait_for(lambda: store.client.scard(workers_key) >= 2, 30, "both workers to register")
    samples: list[tuple[float, float]] = []  # (seconds since the burst started, age)
    fed, drained_at = 0, None
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        due = min(ITEMS, int(elapsed * ARRIVALS_PER_S))
        if due > fed:
            items = [Item(f"b{n:04d}", {"n": n}) for n in range(fed, due)]
            store.add(run_id, items, max_attempts=5, backoff_base=0.1, backoff_cap=0.2)
            fed = due
        if drained_at is None and elapsed >= DRAIN_AT:
            os.kill(workers[0].pid, signal.SIGTERM)
            drained_at = elapsed
        status = store.status(run_id)
        samples.append((elapsed, status.oldest_eligible_age_seconds))
        if fed == ITEMS and status.counts["done"] + status.counts["dead"] == ITEMS:
            break
        assert elapsed < 120, f"the burst did not finish: {status.counts}, {procs.log('w1')}"
        dispatch_due(store, run_id, queue_name)
        time.sleep(0.1)
    assert workers[0].wait(timeout=30) == 0, procs.log("w0")
    assert workers[0].pid not in leased_by(store, run_id).values()
    assert workers[1].poll() is None, "the other worker kept working"

    assert drained_at is not None
    before = [age for at, age in samples if at <= drained_at]
    after = [age for at, age in samples if at > drained_at]
    at_drain = before[-1]
    peak = max(after)
    assert peak >= at_drain + 0.5, f"the age rose after the drain: {samples}"
    assert after[-1] <= 0.5, f"the age fell back once the rest finished: {samples}"
    assert after.index(peak) < len(after) - 1, "it fell after its peak"

    # Retries: attempts (claims), not transitions (commits, items done).
    expected_retries = sum(fails_first(n) for n in range(ITEMS))
    status = store.status(run_id)
    events = status.counters
    assert status.counts == {"pending": 0, "leased": 0, "done": ITEMS, "dead": 0}
    assert events["commits"] == ITEMS, "each item done once"
    assert events["retries"] == expected_retries
    # Every claim is an attempt: one per item, one per retry, one per item given back.
    released = events.get("releases", 0)
    assert events["claims"] == ITEMS + expected_retries + released
    records = list(all_records(store, run_id))
    assert len(records) == ITEMS and {r.state for r in records} == {"done"}
    # a release gives its attempt back, so the records' attempts are the claims not given back
    assert sum(r.attempts for r in records) == events["claims"] - released
    for record in records:
        assert record.result == int(record.item_id[1:])
        first_fails = fails_first(int(record.item_id[1:]))
        assert record.attempts >= (2 if first_fails else 1), record

    metrics = metrics_of(store, run_id)
    assert metrics["redis_lease_claims_total"] == events["claims"]
    assert metrics["redis_lease_commits_total"] == ITEMS
    assert metrics["redis_lease_retries_total"] == expected_retries
    assert metrics["redis_lease_items:done"] == ITEMS
    assert metrics["redis_lease_oldest_eligible_age_seconds"] == 0
