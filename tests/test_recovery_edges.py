"""Edges of recovery: planning cut by Redis, resuming an unplanned run, bad handler results."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
import redis

from redis_lease import InvalidInput, Item, LeaseStore, RedisUnavailable
from redis_lease.effects import idempotency_key
from redis_lease.jobs import Job
from redis_lease.runs import Runs
from redis_lease.worker import LeaseKeeper, work_shard

DAY = date(2026, 12, 2)
NOW = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def test_a_redis_failure_while_planning_leaves_the_run_planning(store: LeaseStore) -> None:
    job = Job("edge-plan", shards=2, deadline="1h")
    runs = Runs(store)
    run_id, _ = runs.ensure(job, DAY, NOW)
    original_add = store.add
    calls = 0

    def flaky_add(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RedisUnavailable("Redis at test is unreachable")
        return original_add(*args, **kwargs)

    @job.planner
    def plan(business_date: date) -> Iterator[Item]:
        for n in range(1200):
            yield Item(f"i{n}")

    store.add = flaky_add  # type: ignore[method-assign]
    with pytest.raises(RedisUnavailable):
        runs.plan(job, run_id)
    assert runs.info(run_id)["state"] == "planning", "not failed: the next tick plans again"
    store.add = original_add  # type: ignore[method-assign]
    assert runs.plan(job, run_id) == 1200
    assert runs.info(run_id)["state"] == "running"
    assert store.status(run_id).total == 1200


def test_resuming_a_run_whose_plan_failed_plans_it_again(store: LeaseStore) -> None:
    job = Job("edge-resume", shards=1, deadline="1h")
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
    job = Job("edge-result", shards=1, batch_size=5, lease_ttl=30)

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


def test_effect_names_cannot_make_two_keys_alike() -> None:
    assert idempotency_key("job:2026-12-02", "a:b", "c") == "job:2026-12-02|a:b|c"
    assert idempotency_key("job:2026-12-02", "a", "b:c") == "job:2026-12-02|a|b:c"
    with pytest.raises(InvalidInput):
        idempotency_key("job:2026-12-02", "a", "b|c")


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
