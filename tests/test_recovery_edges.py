"""Edges of recovery: planning cut by a lost connection, resuming an unplanned run, bad handler
results, and effect keys that no two (item, effect) pairs share."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
import redis

from redis_lease import InvalidInput, Item, LeaseStore, RedisUnavailable
from redis_lease.fleet.effects.ledger import apply_effect, idempotency_key
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import PLAN_BATCH, PLANNER_LOCK_MS, Runs
from redis_lease.fleet.worker.shard_job import LeaseKeeper, work_shard
from redis_lease.limits import ID_MAX_LENGTH
from tests.faults.proxy import CuttingProxy
from tests.fleet_helpers import wait_for
from tests.redis_server import RedisServer

DAY = date(2026, 12, 2)
NOW = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def test_a_lost_connection_while_planning_leaves_the_run_planning(
    private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    """The planner's connection is cut for good while it reads its second batch: the first
    batch is in, the run stays planning (not failed), and once the lost planner's lock has
    lapsed the next plan adds the rest."""
    server = private_redis()
    proxy = CuttingProxy(server.port, most=0)  # relays everything until it is closed
    store = LeaseStore.from_url(proxy.url, prefix=prefix)
    direct = LeaseStore.from_url(server.url, prefix=prefix)
    try:
        job = Job("edge-plan", shards=2, deadline_after=timedelta(hours=1))
        run_id, _ = Runs(store).ensure(job, DAY, NOW)
        items = 2 * PLAN_BATCH + 200
        cut = PLAN_BATCH + 100  # inside the second batch, before it is sent

        @job.planner
        def plan(business_date: date) -> Iterator[Item]:
            for n in range(items):
                if n == cut:
                    proxy.close()  # every connection through the relay is gone, none comes back
                yield Item(f"i{n}")

        with pytest.raises(RedisUnavailable):
            Runs(store).plan(job, run_id)
        assert proxy.cuts == 0, "no command was cut: the relay was closed"
        runs = Runs(direct)
        assert runs.info(run_id)["state"] == "planning", "not failed: the next tick plans again"
        assert direct.status(run_id).total == PLAN_BATCH, "the first batch only"
        # The lost planner could not release its lock: it lapses after its TTL.
        lock = direct.keys.run_planner(run_id)
        assert 0 < direct.client.pttl(lock) <= PLANNER_LOCK_MS
        assert runs.plan(job, run_id) is None, "held by the lost planner"
        direct.client.pexpire(lock, 1)  # its TTL, shortened
        wait_for(lambda: direct.client.exists(lock) == 0, 5, "the planner lock to lapse")
        assert runs.plan(job, run_id) == items
        assert runs.info(run_id)["state"] == "running"
        assert direct.status(run_id).total == items
    finally:
        proxy.close()
        store.client.close()
        direct.client.close()


def test_resuming_a_run_whose_plan_failed_plans_it_again(store: LeaseStore) -> None:
    job = Job("edge-resume", shards=1, deadline_after=timedelta(hours=1))
    runs = Runs(store)
    run_id, _ = runs.ensure(job, DAY, NOW)
    fail = True

    @job.planner
    def plan(business_date: date) -> Iterator[Item]:
        yield Item("a")
        if fail:
            raise RuntimeError("export not ready")
        yield Item("b")

    with pytest.raises(RuntimeError):
        runs.plan(job, run_id)
    assert runs.info(run_id)["state"] == "failed"
    runs.resume(run_id, runs.server_now() + timedelta(hours=1))
    assert runs.info(run_id)["state"] == "planning"
    fail = False
    assert runs.plan(job, run_id) == 2
    assert store.status(run_id).total == 2


def test_a_result_that_is_not_json_fails_only_its_item(store: LeaseStore) -> None:
    job = Job("edge-result", shards=1, batch_size=5, lease_ttl_seconds=30)

    @job.handler
    def handle(item: Item, lease: Any) -> Any:
        return {"when": object()} if item.id == "bad" else {"ok": True}

    store.add("r", [Item("bad"), Item("good1"), Item("good2")])
    keeper = LeaseKeeper(store, 30)
    report = work_shard(
        store, job, "r", 0, worker="w", budget=30, stop=threading.Event(), keeper=keeper
    )
    assert (report.committed, report.failed) == (2, 1)
    bad = store.item("r", "bad")
    assert bad.state == "dead" and bad.error is not None and "permanent" in bad.error
    assert {store.item("r", i).state for i in ("good1", "good2")} == {"done"}


#: Ids over a letter and characters ids allow that could join parts of a key.
SHORT_IDS = [
    "".join(chars) for size in (1, 2, 3) for chars in itertools.product("a:./", repeat=size)
]
#: Ids long enough that the key is cut to a head and a digest: only the digest differs.
LONG_ITEMS = ["x" * (ID_MAX_LENGTH - 1) + c for c in "a:./"]
LONG_EFFECTS = ["y" * 60 + c for c in "a:./"]
#: (item, effect) pairs whose parts join to the same text with ':' or with nothing.
JOINED_ALIKE = [("a:b", "c"), ("a", "b:c"), ("ab", "c"), ("a", "bc"), ("a:", "b"), ("a", ":b")]


def test_effect_names_cannot_make_two_keys_alike(store: LeaseStore) -> None:
    """No two (item, effect) pairs of a run share an idempotency key or a ledger entry."""
    run = "job:2026-12-02"
    pairs = [(i, e) for i in SHORT_IDS for e in SHORT_IDS]
    pairs += [(i, e) for i in LONG_ITEMS + SHORT_IDS[:4] for e in LONG_EFFECTS + SHORT_IDS[:4]]
    keys = {idempotency_key(run, item, effect) for item, effect in pairs}
    assert len(keys) == len(set(pairs)), "two pairs share a key"
    assert any("~" in key for key in keys), "some keys are cut to a head and a digest"
    with pytest.raises(InvalidInput):
        idempotency_key(run, "a", "b|c")

    # In the ledger: every pair's effect is sent once, under a key of its own.
    store.add(run, [Item(item) for item in {item for item, _ in JOINED_ALIKE}], shards=2)
    leases = {item: store.claim(run, item, "w") for item in dict(JOINED_ALIKE)}
    sent: dict[str, tuple[str, str]] = {}
    for item, effect in JOINED_ALIKE:

        def call(key: str, pair: tuple[str, str] = (item, effect)) -> dict[str, str]:
            sent[key] = pair
            return {"sent": key}

        result = apply_effect(store, leases[item], effect, call)
        assert sent.get(result["sent"]) == (item, effect), "another pair's stored result"
    assert sorted(sent.values()) == sorted(JOINED_ALIKE), "an effect was taken for another's"
    ledger = dict(store.effects(run))
    assert set(ledger) == set(sent)
    for key, (item, effect) in sent.items():
        assert ledger[key]["item"] == item and ledger[key]["name"] == effect
        assert ledger[key]["state"] == "applied" and ledger[key]["result"] == {"sent": key}


def test_an_index_entry_without_a_record_does_not_wedge_the_shard(store: LeaseStore) -> None:
    store.add("r", [Item("a"), Item("b")])
    keys = store.keys.shard("r", 0)
    store.client.zadd(keys[3], {"ghost": 0})  # a due entry whose record is gone
    leases = store.claim_next("r", "w", shard=0, limit=10)
    assert sorted(lease.item_id for lease in leases) == ["a", "b"]
    assert store.client.zscore(keys[3], "ghost") is None


def test_scripts_refuse_malformed_arguments_before_writing(store: LeaseStore) -> None:
    store.add("r", [Item("a")])
    keys = store.keys.shard("r", 0)
    before = store.client.hgetall(keys[0])
    with pytest.raises(redis.ResponseError, match="INVALID"):
        store.scripts.run("close_shard", keys, ["yes"])
    with pytest.raises(redis.ResponseError, match="INVALID"):
        store.scripts.run("add_items", keys, ["r", 0, "many", 1000, 2000, "b", "null"])
    assert store.client.hgetall(keys[0]) == before
    assert store.client.hexists(keys[2], "b") == 0
