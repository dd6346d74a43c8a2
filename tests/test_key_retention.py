"""Every key a run creates expires with it: a fleet run is made, worked to its end by an
RQ worker in this process and finalized by the tick, then every key under the test's
prefix is read. Each has a TTL no longer than the run's retention, or is one of the keys
that outlive runs (``redis_lease.protocol.keys.OUTLIVE_RUNS``)."""

from __future__ import annotations

import importlib
from datetime import date

import pytest

from redis_lease import LeaseStore
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.fleet.transport import shard_jobs
from redis_lease.limits import DAY_MS
from redis_lease.protocol.connection.clients import as_text
from redis_lease.protocol.keys import OUTLIVE_RUNS
from tests import fleet_jobs
from tests.fleet_helpers import FLEET_PATH, fleet_env, purge_queue
from tests.rq_helpers import burst


def test_every_key_a_run_creates_expires_with_it_or_outlives_runs_by_name(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = real_store
    queue_name = f"{store.prefix}-q"
    for name, value in fleet_env(queue_name, items=12, shards=3, ttl=5).items():
        monkeypatch.setenv(name, value)
    job = importlib.reload(fleet_jobs).fleet
    try:
        runs = Runs(store)
        run_id, _ = runs.ensure(job, date(2031, 7, 3), runs.server_now())
        tick(store, [FLEET_PATH])  # plans the run and dispatches its shard jobs
        assert shard_jobs.queue(store.client, queue_name).count == 3
        burst(store.client, queue_name, f"{store.prefix}-w1")
        tick(store, [FLEET_PATH])  # finalizes it
        assert runs.info(run_id)["state"] == "succeeded"
    finally:
        purge_queue(store.client, queue_name)

    retention_ms = job.options.retention_days * DAY_MS
    outliving = store.keys.outliving_runs([job.name])
    handlers_own = {fleet_jobs.effects_key(store.prefix)}  # the test job's handler writes it
    expiring, kept, escaped = [], [], []
    for raw in store.client.scan_iter(match=store.keys.everything, count=1000):
        key = as_text(raw)
        if key in handlers_own:
            continue
        if key in outliving:
            kept.append(key)
            continue
        ttl = store.client.pttl(key)
        (expiring if 0 < ttl <= retention_ms else escaped).append((key, ttl))
    assert not escaped, f"keys that outlive the run without being in OUTLIVE_RUNS: {escaped}"
    expiring_names = {key for key, _ in expiring}
    assert store.keys.run(run_id) in expiring_names
    assert store.keys.run_capacity(run_id) in expiring_names, "the worker measured its passes"
    meta, counts, items = store.keys.shard(run_id, 2)[:3]
    assert {meta, counts, items, store.keys.attempts(run_id, 2)} <= expiring_names
    assert store.keys.job(job.name) in kept and store.keys.runs in kept
    assert len(OUTLIVE_RUNS) == len(set(OUTLIVE_RUNS))
