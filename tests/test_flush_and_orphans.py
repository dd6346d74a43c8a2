"""Stalls the fault suite found: scripts flushed between reload and retry, a job lost in RQ's hands.

- A ``SCRIPT FLUSH`` between redis-py's reload of a script and its retry
  failed a single call (a claim, an effect record) and left the tick's lock
  held until its TTL, so every tick skipped the job for a minute.
- A shard job that a worker took off its queue and died before starting (or
  whose queue list was lost) still read ``queued``; it counted as live, so no
  new shard job was sent for minutes, until RQ's maintenance requeued it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
import redis

from redis_lease import Item, LeaseStore
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.scheduler_tick import tick_job
from redis_lease.fleet.transport.shard_jobs import MISSING_GRACE_MS, purge_queue
from redis_lease.protocol.store.store_client import lock
from tests.effect_jobs import EFFECTS_PATH, EffectConfig, delete_rq_queue, make_effects_job
from tests.effect_jobs import start_run as create_run
from tests.redis_server import RedisServer


def flush_after_loads(client: redis.Redis, times: int) -> None:
    """Makes the next ``times`` script loads be followed at once by a SCRIPT FLUSH."""
    load = client.script_load
    left = [times]

    def load_then_flush(script: str) -> str:
        sha: str = load(script)
        if left[0] > 0:
            left[0] -= 1
            client.script_flush()
        return sha

    client.script_load = load_then_flush  # type: ignore[method-assign]


@pytest.fixture
def flushed_store(private_redis: Callable[..., RedisServer], prefix: str) -> Iterator[LeaseStore]:
    """A store on a private server whose scripts were just flushed."""
    store = LeaseStore.from_url(private_redis().url, prefix=prefix)
    yield store
    store.client.close()


def test_a_flush_between_reload_and_retry_costs_a_reload_not_the_call(
    flushed_store: LeaseStore,
) -> None:
    store = flushed_store
    store.add("r", [Item("a"), Item("b")])
    store.client.script_flush()
    flush_after_loads(store.client, 2)  # redis-py's own reload is flushed, and the next one
    leases = store.claim_next("r", "w", limit=2, ttl=30)
    assert sorted(lease.item_id for lease in leases) == ["a", "b"]
    noscript = store.client.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0)
    assert noscript >= 2  # the flushes really met the call


def test_a_lock_is_released_even_when_its_script_was_flushed_twice(
    flushed_store: LeaseStore,
) -> None:
    store = flushed_store
    with lock(store, "lk", 60_000) as taken:
        assert taken
        with lock(store, "lk", 60_000) as again:
            assert not again  # held: a second holder is refused
        store.client.script_flush()
        flush_after_loads(store.client, 2)
    assert store.client.exists("lk") == 0  # released: the next tick is not skipped


@pytest.fixture
def effects(real_store: LeaseStore, prefix: str) -> Iterator[tuple[LeaseStore, EffectConfig]]:
    """The effects job on a queue of this test's own (no workers run)."""
    config = EffectConfig(queue=f"{prefix}-q", items=4, shards=2)
    yield real_store, config
    delete_rq_queue(real_store.client, config.queue)


def test_a_shard_job_lost_off_its_queue_is_dispatched_again(
    effects: tuple[LeaseStore, EffectConfig],
) -> None:
    store, config = effects
    job = make_effects_job(config)
    runs = Runs(store)
    run_id = create_run(store, job)
    tick_job(store, runs, EFFECTS_PATH, job, datetime.now(UTC))  # plans, sends 2 shard jobs
    queue_key = f"rq:queue:{config.queue}"
    sent = [i.decode() for i in store.client.lrange(queue_key, 0, -1)]
    assert len(sent) == 2
    # A worker takes one off the queue, as RQ's BLMOVE does, and dies before starting it.
    store.client.lmove(queue_key, f"{queue_key}:intermediate", "LEFT", "RIGHT")
    decisions = tick_job(store, runs, EFFECTS_PATH, job, datetime.now(UTC))
    # for a moment it may be a live worker about to start it: not sent again yet
    assert [d for d in decisions if d.kind == "dispatch"] == []
    missing_key = store.keys.run_jobs_missing(run_id)
    (taken,) = store.client.hkeys(missing_key)
    assert taken.decode() == sent[0]
    # the grace has passed (its first sighting moved back): the job is taken for dead
    first_seen = int(store.client.hget(missing_key, taken) or 0)
    store.client.hset(missing_key, taken, first_seen - MISSING_GRACE_MS)
    decisions = tick_job(store, runs, EFFECTS_PATH, job, datetime.now(UTC))
    dispatched = [d for d in decisions if d.kind == "dispatch"]
    assert [d.reason for d in dispatched] == ["enqueued 1 shard job where no job was live"]
    after = [i.decode() for i in store.client.lrange(queue_key, 0, -1)]
    assert len(after) == 2 and sent[1] in after  # the waiting job still counts as live
    assert store.client.hlen(missing_key) == 0  # the dead one is forgotten
    assert runs.info(run_id)["state"] == "running"
    # purging the queue also deletes the job left in RQ's intermediate list
    purge_queue(store.client, config.queue)
    assert not store.client.exists(f"{queue_key}:intermediate", f"rq:job:{sent[0]}")
