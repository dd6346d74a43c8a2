"""A run made again after a loss of data is as careful with its effects as a first run.

The effect ledger lives in the run's own keys and goes with them. In a run made again
after a loss (or one that lived through it), an effect with no ledger record may have
been applied before the loss: it is reconciled by ``lookup``, sent again only to a
provider that honours idempotency keys, and otherwise stops with NeedsReconciliation
(the item dead, visible, settled by ``resolve_effect``). The doubt is kept in each
shard's settings (its ``after_loss`` flag) and read by ``record_effect.lua`` in the same
call that reads the ledger, so a worker in any language gets it.

The unit-level tests use a real Redis (the ``real_store`` and ``store`` fixtures) and the
loopback provider told not to dedupe by key; the end-to-end test restarts a private
``redis-server`` empty in the middle of a fleet run (tests/faults/cluster.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import pytest

from redis_lease import Item, LeaseStore
from redis_lease.demo.provider import ProviderClient, ProviderServer, ProviderState
from redis_lease.fleet.effects.ledger import (
    NeedsReconciliation,
    apply_effect,
    idempotency_key,
    resolve_effect,
)
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.protocol.connection.clients import as_text
from tests.faults.cluster import Cluster
from tests.fleet_helpers import NIGHTLY_PATH
from tests.helpers import keys_under
from tests.test_data_loss import D1, D2, RUN1, RUN2, at, kinds, wipe
from tests.test_loss_faults import EVERY_MINUTE, assert_made_again, of_kind, quarter_done
from tests.test_run_accounting import Configure
from tests.test_run_accounting import nightly as nightly  # the fixture

DAY = date(2026, 12, 2)
RUN = f"payouts:{DAY}"
ITEMS = [f"acct_{n}:cursor_{n % 3}:2026-12-02" for n in range(6)]
EFFECT = "payout"


@pytest.fixture
def provider() -> Iterator[ProviderServer]:
    """The loopback provider, applying a repeated key again (it does not dedupe)."""
    with ProviderServer(state=ProviderState(honour_keys=False)).start() as server:
        yield server


def first_run_paid(store: LeaseStore, client: ProviderClient) -> None:
    """The first run: every item's payout applied at the provider, then the run's keys lost
    (what a restart without persistence or an eviction does to the ledger)."""
    store.add(RUN, [Item(i, {"n": n}) for n, i in enumerate(ITEMS)], shards=2)
    for item_id in ITEMS:
        lease = store.claim(RUN, item_id, "w1", ttl=30.0)
        apply_effect(store, lease, EFFECT, lambda key: client.apply(key, {"first": True}))
        store.commit(lease)
    lose_the_run(store)


def lose_the_run(store: LeaseStore) -> None:
    """Deletes every key of the run, as a loss of data does."""
    for key in list(store.client.scan_iter(match=f"{store.prefix}:*", count=1000)):
        store.client.delete(key)  # one at a time: on a Redis Cluster they are in many slots


def payouts_job() -> Job:
    """The job whose run is made again: its planner makes the same items."""
    job = Job("payouts", shards=2, schedule="0 0 29 2 *")

    @job.planner
    def plan(day: date) -> Iterator[Item]:
        for n, item_id in enumerate(ITEMS):
            yield Item(item_id, {"n": n})

    return job


def made_again(store: LeaseStore) -> None:
    """The run made again after the loss as the tick makes it (``after_loss`` in its
    record), and planned: its items are added again."""
    runs = Runs(store)
    job = payouts_job()
    run_id, created = runs.ensure(
        job, DAY, runs.server_now(), fields={"after_loss": "a test lost it"}
    )
    assert (run_id, created) == (RUN, True)
    assert runs.plan(job, run_id) == len(ITEMS)


def applications(server: ProviderServer) -> dict[str, int]:
    """Applications by key at the provider."""
    with server.state.lock:
        return dict(server.state.applications)


def test_after_a_loss_a_lookup_finds_each_effect_and_nothing_is_sent(
    store: LeaseStore, provider: ProviderServer
) -> None:
    """Every payout the first run made is found by the lookup and not sent again. Breaks
    if a missing record reads as "never sent" (as it did: every payout went out again)."""
    client = ProviderClient(provider.url)
    first_run_paid(store, client)
    made_again(store)
    for item_id in ITEMS:
        lease = store.claim(RUN, item_id, "w2", ttl=30.0)
        result = apply_effect(
            store, lease, EFFECT, lambda key: client.apply(key, {}), lookup=client.lookup
        )
        assert result == client.lookup(idempotency_key(RUN, item_id, EFFECT))
        store.commit(lease)
    assert set(applications(provider).values()) == {1} and len(applications(provider)) == 6
    counters = store.status(RUN).counters
    assert counters["effects_applied"] == 6 and counters["effects_reconciled"] == 6


def test_after_a_loss_a_lookup_that_finds_nothing_sends_once(
    store: LeaseStore, provider: ProviderServer
) -> None:
    """A payout the first run never made is looked up, found missing and sent."""
    client = ProviderClient(provider.url)
    made_again(store)
    lease = store.claim(RUN, ITEMS[0], "w2", ttl=30.0)
    looked_up: list[str] = []

    def lookup(key: str) -> object:
        looked_up.append(key)
        return client.lookup(key)

    result = apply_effect(store, lease, EFFECT, lambda key: client.apply(key, {}), lookup=lookup)
    assert result["key"] == f"{RUN}|{ITEMS[0]}|{EFFECT}" and looked_up == [result["key"]]
    assert applications(provider) == {result["key"]: 1}
    record = store.effect(RUN, ITEMS[0], result["key"])
    assert record is not None and (record["state"], record["attempts"]) == ("applied", 1)


def test_after_a_loss_a_provider_that_honours_keys_is_sent_the_key_again(
    store: LeaseStore,
) -> None:
    with ProviderServer(state=ProviderState(honour_keys=True)).start() as server:
        client = ProviderClient(server.url)
        first_run_paid(store, client)
        made_again(store)
        lease = store.claim(RUN, ITEMS[0], "w2", ttl=30.0)
        result = apply_effect(
            store, lease, EFFECT, lambda key: client.apply(key, {}), honours_keys=True
        )
        key = f"{RUN}|{ITEMS[0]}|{EFFECT}"
        assert result["key"] == key
        assert server.state.requests[key] == 2 and server.state.applications[key] == 1


def test_after_a_loss_neither_lookup_nor_keys_needs_reconciliation_and_resolves(
    store: LeaseStore, provider: ProviderServer
) -> None:
    """The item goes dead with NeedsReconciliation naming the loss, the effect shows as
    unknown in the status, and ``resolve_effect`` settles it: never sent again."""
    client = ProviderClient(provider.url)
    first_run_paid(store, client)
    made_again(store)
    item_id = ITEMS[0]
    key = f"{RUN}|{item_id}|{EFFECT}"
    lease = store.claim(RUN, item_id, "w2", ttl=30.0)
    with pytest.raises(NeedsReconciliation) as raised:
        apply_effect(store, lease, EFFECT, lambda k: client.apply(k, {}))
    message = str(raised.value)
    assert "made again after a loss of data" in message
    assert f"redis-lease resolve-effect {RUN} {item_id} {EFFECT}" in message
    store.fail(lease, message, permanent=True)  # what the worker does with it
    assert store.item(RUN, item_id).state == "dead"
    assert applications(provider)[key] == 1  # not sent again
    status = store.status(RUN)
    assert status.counters["effects_unknown"] == 1 and status.counts["dead"] == 1
    record = store.effect(RUN, item_id, key)
    assert record is not None and record["state"] == "unknown"
    assert "loss of data" in json.loads(record["error"])

    found = client.lookup(key)
    settled = resolve_effect(store, RUN, item_id, EFFECT, applied=True, result=found)
    assert (settled["state"], settled["result"]) == ("applied", found)
    again = store.claim(RUN, item_id, "w3", ttl=30.0)
    assert apply_effect(store, again, EFFECT, lambda k: client.apply(k, {})) == found
    assert applications(provider)[key] == 1


def test_the_flag_is_on_every_shard_and_only_where_set(real_store: LeaseStore) -> None:
    """A shard without the mark behaves as before: a missing record is a new effect; once
    marked, a missing record is a doubt, and a record that survived is read as before."""
    store = real_store
    store.add(RUN, [Item(i, {"n": n}) for n, i in enumerate(ITEMS)], shards=2)
    lease = store.claim(RUN, ITEMS[0], "w1", ttl=30.0)
    sent: list[str] = []
    apply_effect(store, lease, EFFECT, lambda key: sent.append(key) or {"id": "c1"})
    assert len(sent) == 1
    store.set_after_loss(RUN)
    store.set_after_loss(RUN)  # safe to repeat
    assert marks(store, RUN) == ["1", "1"]
    # A record that survived is read as before: applied is final.
    assert apply_effect(store, lease, EFFECT, lambda key: sent.append(key)) == {"id": "c1"}
    lease = store.claim(RUN, ITEMS[1], "w1", ttl=30.0)
    with pytest.raises(NeedsReconciliation):
        apply_effect(store, lease, EFFECT, lambda key: sent.append(key) or {"id": "c2"})
    assert len(sent) == 1


def test_planning_a_run_made_again_sets_the_flag_before_its_items(real_store: LeaseStore) -> None:
    """``Runs.plan`` of a run whose record says ``after_loss`` marks every shard before the
    planner's first item is added; a run made for the first time is not marked."""
    store = real_store
    seen: list[list[str | None]] = []
    job = payouts_job()
    planner = job.plan_items
    assert planner is not None

    def plan(day: date) -> Iterator[Item]:
        seen.append(marks(store, f"payouts:{day}"))  # when the first item is asked for
        yield from planner(day)

    job.plan_items = plan
    runs = Runs(store)
    run_id, _ = runs.ensure(job, DAY, runs.server_now(), fields={"after_loss": "lost"})
    runs.plan(job, run_id)
    other, _ = runs.ensure(job, date(2026, 12, 3), runs.server_now())
    runs.plan(job, other)
    assert seen == [["1", "1"], [None, None]]
    assert marks(store, run_id) == ["1", "1"] and marks(store, other) == [None, None]


# -- end to end: a private Redis restarted empty mid-run -----------------------------------


@pytest.mark.slow
def test_a_lookup_only_job_pays_nothing_twice_after_redis_restarts_empty(
    tmp_path: Path, prefix: str
) -> None:
    """The issue's measurement: a job that pays through ``lease.effect(..., lookup=...)`` at
    a provider that does not dedupe, its Redis restarted empty mid-run, the run made again
    by the tick. Every payout of the first run is found by the lookup: none is applied
    twice (before the fix: dozens were)."""
    settings = {
        "items": 96,
        "hold_after": 96 // 4 + 4,
        "shards": 2,
        "ttl": 1.5,
        "schedule": EVERY_MINUTE,
        "provider": ProviderState(honour_keys=False, latency=0.05),
        "honours_keys": False,
        "use_lookup": True,
    }
    with Cluster(tmp_path / "c", prefix, workers=2, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=lambda: quarter_done(c, run_id))
        paid_before = len(c.provider.state.applications)
        assert 0 < paid_before < c.config.items  # mid-run
        restarted = c.restart_redis(empty=True)
        c.lift_hold()
        assert c.drive(run_id, timeout=120) == "succeeded"
        assert of_kind(c.decisions, "data_lost")
        assert_made_again(c, run_id, "the tick side remembered it open")
        applied = c.provider.state.applications
        twice = {key: n for key, n in applied.items() if n > 1}
        assert twice == {}, f"{len(twice)} payouts applied twice: {twice}"
        assert len(applied) == c.config.items
        assert c.store.status(run_id).counters.get("effects_reconciled", 0) >= paid_before
        c.verify(run_id, loss=(0, restarted))


def test_the_tick_marks_a_run_that_lived_through_a_loss_and_one_made_again(
    real_store: LeaseStore, nightly: Configure
) -> None:
    """An older snapshot is put back (a failover that missed the last writes): the run made
    before it lived through the loss, the run made after it is made again. The tick marks
    every shard of both: effects with no record in either may have been applied."""
    nightly(schedule="0 2 * * *", deadline_after=timedelta(hours=72), catch_up="all")
    store, client = real_store, real_store.client
    tick(store, [NIGHTLY_PATH], now=at(D1, 2))
    snapshot = {
        key: (client.dump(key), client.pttl(key)) for key in keys_under(client, store.prefix)
    }
    tick(store, [NIGHTLY_PATH], now=at(D2, 2))
    wipe(store)
    for key, (dumped, ttl) in snapshot.items():
        assert dumped is not None
        client.restore(key, max(ttl, 0), dumped, replace=True)
    for run_id in (RUN1, RUN2):
        assert marks(store, run_id) in ([None] * store.shard_count(run_id), [])
    decisions = tick(store, [NIGHTLY_PATH], now=at(D2, 3))
    assert ("loss", RUN1) in kinds(decisions) and ("rerun", RUN2) in kinds(decisions)
    for run_id in (RUN1, RUN2):
        assert marks(store, run_id) == ["1"] * store.shard_count(run_id)


def marks(store: LeaseStore, run_id: str) -> list[str | None]:
    """Each shard's ``after_loss`` mark (None where unmarked), or [] for a run with no record."""
    if not store.client.exists(store.keys.run(run_id)):
        return []
    metas = [store.keys.shard(run_id, shard)[0] for shard in range(store.shard_count(run_id))]
    raw = [store.client.hget(meta, "after_loss") for meta in metas]
    return [None if value is None else as_text(value) for value in raw]
