"""Shard jobs survive transient faults: connections cut mid-run, a provider's endless
Retry-After, an item that cannot be settled.

The cut-connection test runs real worker processes against a private
redis-server through a relay that cuts their connections in mid-command while
they work. Worker processes import :data:`resilience_job` from this module by
path; ``RESILIENCE_TTL`` sets its lease TTL there.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from redis_lease import Item, LeaseStore, ProviderGate, Throttled
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport.shard_jobs import enqueue_shard, purge_queue
from redis_lease.fleet.worker.shard_job import (
    ActiveLease,
    LeaseKeeper,
    ShardReport,
    _log_danger,
    work_shard,
)
from redis_lease.limits import DELAY_MAX_MS
from redis_lease.protocol.leases import CommitReply
from redis_lease.protocol.store.lease_store import CommitRequest
from tests.faults.proxy import CuttingProxy
from tests.fleet_helpers import Processes, all_records, drive
from tests.helpers import server_ms
from tests.redis_server import RedisServer

JOB_PATH = f"{__name__}:resilience_job"
ITEMS = 40
DELAY = 0.02

resilience_job = Job(
    "resilience",
    shards=2,
    lease_ttl_seconds=float(os.environ.get("RESILIENCE_TTL", "6")),
    batch_size=5,
    shard_budget_seconds=120,
    max_attempts=10,
    backoff_base_seconds=0.1,
    backoff_cap_seconds=0.5,
    deadline_after=timedelta(minutes=10),
    schedule="0 0 29 2 *",  # 29 February only: nothing falls due by itself
    queue="rltest-resilience",  # on a private server: no other test shares it
)


def handled_key(prefix: str, item_id: str) -> str:
    """The set of tokens under which the handler ran for an item."""
    return f"{prefix}:handled:{item_id}"


@resilience_job.planner
def plan(business_date: date) -> Iterator[Item]:
    """``ITEMS`` items."""
    for n in range(ITEMS):
        yield Item(f"item-{n:03d}", {"n": n})


@resilience_job.handler
def handle(item: Item, lease: ActiveLease) -> dict[str, Any]:
    """Records the token it ran under (a set: a retried SADD counts once) and works a while."""
    lease.store.client.sadd(handled_key(lease.store.prefix, item.id), lease.token)
    time.sleep(DELAY)
    return {"n": item.payload["n"] if isinstance(item.payload, dict) else None}


# -- connections cut while workers run --------------------------------------------------


def rq_worker_args(url: str, queue: str) -> list[str]:
    """Plain RQ's worker (its connection has no retry policy of ours)."""
    return [
        *(str(Path(sys.executable).parent / "rq"), "worker", "--url", url),
        *("--serializer", "rq.serializers.JSONSerializer"),
        *("--job-class", "redis_lease.dispatch.JsonJob"),
        *("--worker-class", "rq.worker.SimpleWorker", queue),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("worker", ["redis-lease", "rq"])
def test_shard_jobs_finish_while_connections_are_cut(
    private_redis: Callable[..., RedisServer], procs: Processes, prefix: str, worker: str
) -> None:
    """Every 4th script call of the workers is cut after the server ran it; each costs a
    reconnect and a retry (a retried commit returns the stored outcome), never the job."""
    server = private_redis()
    proxy = CuttingProxy(server.port)
    queue = resilience_job.options.queue
    env = {"RESILIENCE_TTL": "2"}
    store = LeaseStore.from_url(server.url, prefix=prefix)  # the test's own: not cut
    runs = Runs(store)
    run_id, _ = runs.ensure(resilience_job, date(2031, 6, 2), runs.server_now())
    assert runs.plan(resilience_job, run_id) == ITEMS
    for shard in range(resilience_job.options.shards):
        enqueue_shard(
            store, JOB_PATH, queue, run_id, shard, resilience_job.options.shard_budget_seconds
        )
    try:
        if worker == "rq":
            procs.start(rq_worker_args(proxy.url, queue), env, "worker")
        else:
            procs.worker(proxy.url, queue, env, name="worker")
        # A cut claim leaves its items leased until their lease expires: the tick
        # dispatches the shard again then, as it would in production.
        state = drive(store, JOB_PATH, run_id, timeout=90)
    except AssertionError as error:
        counts = store.status(run_id).counts
        raise AssertionError(
            f"{error}: {counts}, {proxy.cuts} cuts; {procs.log('worker')}"
        ) from None
    finally:
        proxy.close()
    assert state == "succeeded", procs.log("worker")
    assert proxy.cuts >= 5, f"only {proxy.cuts} connections were cut"
    status = store.status(run_id)
    assert (status.counts["pending"], status.counts["leased"]) == (0, 0)
    assert status.counters["commits"] == ITEMS, "each item committed once"
    for record in all_records(store, run_id):
        tokens = store.client.smembers(handled_key(prefix, record.item_id))
        assert len(tokens) == 1, f"{record.item_id} handled under tokens {tokens}"
    assert store.client.zcard(f"rq:failed:{queue}") == 0, "no shard job failed"
    purge_queue(store.client, queue)
    store.client.close()


def test_a_reset_during_the_commit_pipeline_costs_a_retry(
    private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    server = private_redis()
    direct = LeaseStore.from_url(server.url, prefix=prefix)
    direct.add("r", [Item(f"i{n}") for n in range(5)])
    settle_sha = direct.scripts["settle"].sha.encode()  # commit_many's script
    direct.client.script_load(direct.scripts["settle"].script)  # the cut hits a run, not NOSCRIPT
    proxy = CuttingProxy(server.port, markers=(b"EVALSHA", settle_sha), every=1, most=1)
    store = LeaseStore.from_url(proxy.url, prefix=prefix)
    leases = store.claim_next("r", "w", limit=5, ttl=30)
    outcomes = store.commit_many([CommitRequest(lease, {"n": 1}) for lease in leases])
    proxy.close()
    assert proxy.cuts == 1, "the first commit pipeline was cut after the server ran it"
    assert all(isinstance(outcome, CommitReply) for outcome in outcomes), outcomes
    assert any(outcome.repeated for outcome in outcomes), "the retry got the stored outcomes"
    status = direct.status("r")
    assert (status.counts["done"], status.counters["commits"]) == (5, 5)


# -- Throttled with a Retry-After past the protocol's longest delay ----------------------


def work_once(store: LeaseStore, job: Job, run_id: str) -> ShardReport:
    """One in-process pass over shard 0 (it ends once nothing is due)."""
    keeper = LeaseKeeper(store, job.options.lease_ttl_seconds)  # not started
    return work_shard(
        store,
        job,
        run_id,
        0,
        worker="w",
        budget=10,
        stop=threading.Event(),
        keeper=keeper,
        wait_for_backoff=False,
    )


def throttling_job(retry_after: float) -> Job:
    """A job whose item ``slow`` is throttled with ``retry_after``; other items succeed."""
    job = Job("throttled", shards=1, lease_ttl_seconds=30, batch_size=10)

    @job.handler
    def handle_throttled(item: Item, lease: ActiveLease) -> Any:
        if item.id == "slow":
            raise Throttled("429 come back later", retry_after=retry_after)
        return {"ok": item.id}

    return job


@pytest.mark.parametrize(
    ("retry_after", "delay_ms"),
    [(3 * 86400, DELAY_MAX_MS), (math.inf, DELAY_MAX_MS), (math.nan, 1000)],
    ids=["3-days", "inf", "nan"],
)
def test_a_throttled_item_is_released_with_the_delay_clamped(
    store: LeaseStore, retry_after: float, delay_ms: int
) -> None:
    store.add("r", [Item("slow"), Item("a"), Item("b")])
    before = server_ms(store.client)
    report = work_once(store, throttling_job(retry_after), "r")
    after = server_ms(store.client)
    assert (report.throttled, report.committed, report.errors) == (1, 2, [])
    record = store.item("r", "slow")
    assert (record.state, record.attempts) == ("pending", 0), "released, attempt not counted"
    due = store.client.zscore(store.keys.shard("r", 0)[3], "slow")
    assert due is not None and before + delay_ms <= due <= after + delay_ms
    assert {store.item("r", i).state for i in ("a", "b")} == {"done"}, "the job went on"


@pytest.mark.parametrize("retry_after", [3 * 86400, math.inf, math.nan])
def test_the_gate_never_holds_a_pause_past_the_longest_delay(
    store: LeaseStore, retry_after: float
) -> None:
    gate = ProviderGate(store, "bank", max_concurrency=4)
    before = server_ms(store.client)
    with pytest.raises(Throttled), gate.slot(wait=1):
        raise Throttled("429", retry_after=retry_after)
    state = gate.state()
    assert state.cap == 2 and state.in_use == 0
    assert before <= state.paused_until_ms <= server_ms(store.client) + DELAY_MAX_MS
    raw = store.client.hget(gate.keys[1], "paused_until")
    assert raw is not None and math.isfinite(float(raw))


# -- an item that cannot be settled ------------------------------------------------------


def refusing_job(action: str, admin: redis.Redis, user: str, give_back: bool, ttl: float) -> Job:
    """A job whose item ``bad`` has the server refuse its settling: the handler takes
    EVALSHA away from the worker's Redis user, then fails (``fail``) or is throttled
    (``release``). With ``give_back``, the other items' handlers give EVALSHA back first."""
    job = Job("refused", shards=1, lease_ttl_seconds=ttl, batch_size=10, commit_interval_seconds=0)

    @job.handler
    def handle_refused(item: Item, lease: ActiveLease) -> Any:
        if item.id == "bad":
            admin.execute_command("ACL", "SETUSER", user, "-evalsha")
            if action == "release":
                raise Throttled("429", retry_after=1)
            raise RuntimeError("the ledger export is missing")
        if give_back:
            admin.execute_command("ACL", "SETUSER", user, "+evalsha")
        return {"ok": item.id}

    return job


def refused_store(private_redis: Callable[..., RedisServer], prefix: str) -> LeaseStore:
    """A store on a private server, as a user 'worker' an admin can take EVALSHA from."""
    server = private_redis()
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "worker", "on", ">pw", "~*", "&*", "+@all")
    admin.close()
    store = LeaseStore.from_url(server.url.replace("//", "//worker:pw@"), prefix=prefix)
    store.add("r", [Item("bad"), Item("good"), Item("fine")])
    return store


@pytest.mark.parametrize("action", ["fail", "release"])
def test_a_refused_settlement_is_sent_again_while_its_lease_holds(
    private_redis: Callable[..., RedisServer],
    prefix: str,
    action: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server refuses the settlement (NOPERM); it waits, its lease kept renewed, and is
    sent again once the permission is back; the job goes on meanwhile."""
    store = refused_store(private_redis, prefix)
    admin = redis.Redis.from_url(store.url.replace("worker:pw@", ""))
    with caplog.at_level("WARNING", logger="redis_lease.worker"):
        job = refusing_job(action, admin, "worker", give_back=True, ttl=30)
        report = work_once(store, job, "r")
    settled = report.failed if action == "fail" else report.throttled
    assert (settled, report.committed, report.abandoned) == (1, 2, 0), report
    logged = [r.getMessage() for r in caplog.records]
    assert any("wait for Redis to send them again" in line for line in logged), logged
    assert any("may not run EVALSHA" in line for line in logged), logged
    bad = store.item("r", "bad")
    assert bad.state == "pending" and bad.attempts == (1 if action == "fail" else 0)
    assert {store.item("r", i).state for i in ("good", "fine")} == {"done"}, "the job went on"
    admin.close()
    store.client.close()


def test_a_settlement_refused_until_its_lease_ends_is_left_to_its_lease_expiry(
    private_redis: Callable[..., RedisServer],
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No permission comes back: no renewal goes through either, so each lease runs out by
    the process's clock and its item is left to its expiry (claimable again then)."""
    store = refused_store(private_redis, prefix)
    admin = redis.Redis.from_url(store.url.replace("worker:pw@", ""))
    with caplog.at_level("WARNING", logger="redis_lease.worker"):
        report = work_once(store, refusing_job("fail", admin, "worker", False, ttl=2), "r")
    assert report.committed == 0 and report.abandoned >= 1, report
    assert any("'bad'" in e and "may not run EVALSHA" in e for e in report.errors), report
    logged = [r.getMessage() for r in caplog.records]
    assert any("'bad'" in line and "lease expiry" in line for line in logged), logged
    bad = store.item("r", "bad")
    assert (bad.state, bad.attempts) == ("leased", 1), "left to its lease, not settled"
    admin.close()
    store.client.close()


def test_a_shard_job_logs_an_evicting_server_as_a_danger(
    private_redis: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = private_redis(**{"maxmemory-policy": "allkeys-lru"})
    client = redis.Redis.from_url(server.url)
    url = server.url.replace("//", "//:pw-s3cret@")  # a URL as given, password and all
    try:
        with caplog.at_level(logging.ERROR, logger="redis_lease.worker"):
            _log_danger(LeaseStore(client, url=url))
            _log_danger(LeaseStore(client, url=url))  # once per server and process
        dangers = [r.getMessage() for r in caplog.records if r.getMessage().startswith("danger:")]
        assert len(dangers) == 1 and "allkeys-lru" in dangers[0], dangers
        assert "pw-s3cret" not in dangers[0] and ":***@" in dangers[0], "the URL is masked"
    finally:
        client.close()
