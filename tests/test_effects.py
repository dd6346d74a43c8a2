"""The effect ledger: idempotency keys, fenced transitions, reconciliation before re-issue.

Runs on real Redis and on fakeredis (the ``store`` fixture). Provider calls and
lookups are plain functions here; tests/test_transitions.py runs the same paths
against the HTTP provider with real worker processes.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from redis_lease import InvalidInput, Item, LeaseLost, LeaseStore
from redis_lease.effects import (
    KEY_MAX_LENGTH,
    EffectFailed,
    EffectUnknown,
    NeedsReconciliation,
    Throttled,
    apply_effect,
    idempotency_key,
)
from redis_lease.jobs import Job
from redis_lease.lease import Lease
from redis_lease.worker import ActiveLease, LeaseKeeper, ShardReport, work_shard
from tests.helpers import server_ms, snapshot, wait_past

RUN = "payouts:2026-12-02"
ITEM = "acct_7:cursor_2:2026-12-02"
EFFECT = "payout"
KEY = f"{RUN}|{ITEM}|{EFFECT}"


class Provider:
    """A stand-in provider: counts calls and lookups by key and answers as told."""

    def __init__(self, answer: Any = None, error: BaseException | None = None) -> None:
        self.answer = answer if answer is not None else {"id": "corr_1"}
        self.error = error
        self.calls: list[str] = []
        self.lookups: list[str] = []
        self.found: Any = None

    def call(self, key: str) -> Any:
        """Applies (or fails as told)."""
        self.calls.append(key)
        if self.error is not None:
            raise self.error
        self.found = self.answer
        return self.answer

    def lookup(self, key: str) -> Any:
        """What it applied under ``key``, or None."""
        self.lookups.append(key)
        return self.found


def claim(store: LeaseStore, worker: str = "w1", ttl: float = 30.0) -> Lease:
    """Adds the item once and claims it."""
    store.add(RUN, [Item(ITEM, {"account": 7})], shards=2, backoff_base=0.01)
    return store.claim(RUN, ITEM, worker, ttl=ttl)


def reclaim(store: LeaseStore, lease: Lease, worker: str = "w2") -> Lease:
    """Gives the item back and claims it again (a later attempt, a higher token)."""
    store.release(lease)
    return store.claim(RUN, ITEM, worker, ttl=30.0)


def effects_counts(store: LeaseStore) -> dict[str, int]:
    """The run's effect counters."""
    events = store.status(RUN).events
    return {k: v for k, v in events.items() if k.startswith("effects_")}


def must_not_call(key: str) -> Any:
    """A provider call that the test says must not happen."""
    raise AssertionError(f"the effect {key} was sent again")


# -- idempotency keys ---------------------------------------------------------------


def test_key_is_job_date_item_and_effect() -> None:
    assert idempotency_key(RUN, ITEM, EFFECT) == KEY
    assert idempotency_key(RUN, ITEM, "refund") != KEY
    assert idempotency_key("payouts:2026-12-03", ITEM, EFFECT) != KEY


def test_key_is_the_same_for_every_attempt_token_and_worker(store: LeaseStore) -> None:
    """A first holder times out, its lease expires, a second holder takes over: same key."""
    first = claim(store, "w1", ttl=0.05)
    provider = Provider(error=EffectUnknown("read timed out"))
    with pytest.raises(EffectUnknown):
        apply_effect(store, first, EFFECT, provider.call, lookup=provider.lookup)
    wait_past(store.client, first.expires_at_ms)
    second = store.claim(RUN, ITEM, "w2", ttl=30.0)
    assert (second.token, second.attempt, second.takeover) == (2, 2, True)
    provider.error = None
    assert apply_effect(store, second, EFFECT, provider.call, lookup=provider.lookup) == {
        "id": "corr_1"
    }
    assert provider.calls == [KEY, KEY]
    assert provider.lookups == [KEY]
    record = store.effect(RUN, ITEM, KEY)
    assert record is not None
    assert (record["state"], record["token"], record["attempts"]) == ("applied", 2, 2)
    assert dict(store.effects(RUN)) == {KEY: record}


def test_long_key_keeps_its_start_and_ends_with_a_digest_of_the_whole() -> None:
    run, item = "j:" + "r" * 150, "i" * 199
    full = f"{run}|{item}|{EFFECT}"
    key = idempotency_key(run, item, EFFECT)
    assert len(full) > KEY_MAX_LENGTH
    assert len(key) == KEY_MAX_LENGTH
    assert key == f"{full[:190]}~{hashlib.sha256(full.encode()).hexdigest()}"
    assert idempotency_key(run, item, EFFECT) == key  # stable
    other = idempotency_key(run, item[:-1] + "j", EFFECT)  # differs only past the cut
    assert other != key and other[:190] == key[:190]


def test_key_of_exactly_the_limit_is_kept() -> None:
    run = f"{RUN}-{'r' * 40}"  # ids are at most 200 characters
    item = "i" * (KEY_MAX_LENGTH - len(f"{run}||{EFFECT}"))
    assert idempotency_key(run, item, EFFECT) == f"{run}|{item}|{EFFECT}"
    assert len(idempotency_key(run, item + "x", EFFECT)) == KEY_MAX_LENGTH
    assert "~" in idempotency_key(run, item + "x", EFFECT)


@pytest.mark.parametrize("name", ["", "pay out", "pay{out}", "a#b", "x" * 201])
def test_effect_name_is_validated(name: str) -> None:
    with pytest.raises(InvalidInput):
        idempotency_key(RUN, ITEM, name)


# -- ledger transitions ------------------------------------------------------------


def test_intended_then_applied_is_recorded_and_counted(store: LeaseStore) -> None:
    lease = claim(store)
    previous, record = store.record_effect(lease, KEY, EFFECT, "intended")
    assert previous == ""
    assert (record["state"], record["token"], record["attempts"]) == ("intended", 1, 1)
    assert (record["item"], record["name"]) == (ITEM, EFFECT)
    assert effects_counts(store) == {"effects_intended": 1}
    previous, record = store.record_effect(lease, KEY, EFFECT, "applied", {"id": "corr_5"})
    assert previous == "intended"
    assert (record["state"], record["result"]) == ("applied", {"id": "corr_5"})
    assert effects_counts(store) == {"effects_intended": 0, "effects_applied": 1}
    assert store.effect(RUN, ITEM, KEY) == record


@pytest.mark.parametrize("late", ["intended", "failed", "unknown", "applied"])
def test_applied_is_final(store: LeaseStore, late: str) -> None:
    lease = claim(store)
    store.record_effect(lease, KEY, EFFECT, "intended")
    _, applied = store.record_effect(lease, KEY, EFFECT, "applied", {"id": "corr_5"})
    before = snapshot(store.client, store.prefix)
    assert store.record_effect(lease, KEY, EFFECT, late, {"id": "other"}) == ("applied", applied)
    later = reclaim(store, lease)
    assert store.record_effect(later, KEY, EFFECT, late, "x") == ("applied", applied)
    after = snapshot(store.client, store.prefix)
    effects_key = store.keys.effects(RUN, store.shard_for(RUN, ITEM))[0]
    assert after[effects_key] == before[effects_key]
    assert effects_counts(store) == {"effects_intended": 0, "effects_applied": 1}


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ((), "applied"),
        ((), "unknown"),
        ((), "failed"),
        (("intended", "unknown"), "unknown"),
        (("intended", "failed"), "applied"),
        (("intended", "failed"), "unknown"),
        ((), "done"),
    ],
)
def test_impossible_transition_is_refused_and_writes_nothing(
    store: LeaseStore, path: tuple[str, ...], refused: str
) -> None:
    lease = claim(store)
    for state in path:
        store.record_effect(lease, KEY, EFFECT, state, "detail")
    before = snapshot(store.client, store.prefix)
    with pytest.raises(InvalidInput):
        store.record_effect(lease, KEY, EFFECT, refused, {"id": "corr_5"})
    assert snapshot(store.client, store.prefix) == before


def test_stale_holder_is_refused_and_nothing_changes(store: LeaseStore) -> None:
    """After a takeover the old holder can neither record an outcome nor send anything."""
    stale = claim(store, "w1", ttl=0.05)
    store.record_effect(stale, KEY, EFFECT, "intended")
    wait_past(store.client, stale.expires_at_ms)
    current = store.claim(RUN, ITEM, "w2", ttl=30.0)
    before = snapshot(store.client, store.prefix)
    counts_key = store.keys.shard(RUN, current.shard)[1]

    with pytest.raises(LeaseLost) as lost:
        store.record_effect(stale, KEY, EFFECT, "applied", {"id": "corr_stale"})
    assert lost.value.current_token == current.token
    provider = Provider()
    with pytest.raises(LeaseLost):
        apply_effect(store, stale, EFFECT, provider.call, lookup=provider.lookup)
    with pytest.raises(LeaseLost):  # the right token with another lease id is not the holder
        store.record_effect(replace(current, lease_id="other"), KEY, EFFECT, "applied", {})

    after = snapshot(store.client, store.prefix)
    assert provider.calls == []
    counts_before, counts_after = before.pop(counts_key)[1], after.pop(counts_key)[1]
    assert after == before
    changed = {k: (counts_before.get(k), v) for k, v in counts_after.items()}
    changed = {k: pair for k, pair in changed.items() if pair[0] != pair[1]}
    assert changed == {
        "stale_refused": (None, "3"),
        "stale_effects": (None, "3"),
    }
    record = store.effect(RUN, ITEM, KEY)
    assert record is not None and (record["state"], record["token"]) == ("intended", 1)


# -- apply_effect --------------------------------------------------------------------


def test_applied_effect_is_never_sent_again(store: LeaseStore) -> None:
    first = claim(store)
    provider = Provider()
    assert apply_effect(store, first, EFFECT, provider.call) == {"id": "corr_1"}
    later = reclaim(store, first)  # e.g. the commit was lost with the lease
    assert apply_effect(store, later, EFFECT, must_not_call, honours_keys=True) == {"id": "corr_1"}
    assert provider.calls == [KEY]
    assert effects_counts(store) == {"effects_intended": 0, "effects_applied": 1}


@pytest.mark.parametrize("earlier", ["intended", "unknown"])
def test_earlier_attempt_found_by_lookup_is_not_sent_again(store: LeaseStore, earlier: str) -> None:
    """A crash after the intent, or an ambiguous answer: the lookup settles it."""
    first = claim(store)
    provider = Provider(answer={"id": "corr_9"})
    if earlier == "intended":  # the process died right after sending
        store.record_effect(first, KEY, EFFECT, "intended")
        provider.found = {"id": "corr_9"}
    else:
        provider.error = EffectUnknown("connection reset")
        with pytest.raises(EffectUnknown):
            apply_effect(store, first, EFFECT, provider.call, lookup=provider.lookup)
        provider.found = {"id": "corr_9"}  # it was applied after all
    later = reclaim(store, first)
    result = apply_effect(store, later, EFFECT, must_not_call, lookup=provider.lookup)
    assert result == {"id": "corr_9"}
    assert provider.lookups == [KEY]
    record = store.effect(RUN, ITEM, KEY)
    assert record is not None
    assert (record["state"], record["result"], record["token"]) == ("applied", result, 2)
    counts = effects_counts(store)
    assert counts["effects_applied"] == 1 and counts["effects_reconciled"] == 1
    assert counts.get("effects_unknown", 0) == counts.get("effects_intended", 0) == 0


def test_lookup_that_finds_nothing_sends_again_with_the_same_key(store: LeaseStore) -> None:
    first = claim(store)
    store.record_effect(first, KEY, EFFECT, "intended")  # died before the request left
    later = reclaim(store, first)
    provider = Provider()
    assert apply_effect(store, later, EFFECT, provider.call, lookup=provider.lookup) == {
        "id": "corr_1"
    }
    assert provider.lookups == [KEY] and provider.calls == [KEY]
    record = store.effect(RUN, ITEM, KEY)
    assert record is not None and (record["state"], record["attempts"]) == ("applied", 2)
    assert "effects_reconciled" not in effects_counts(store)


@pytest.mark.parametrize("earlier", ["intended", "unknown"])
def test_no_lookup_and_no_key_honouring_needs_reconciliation(
    store: LeaseStore, earlier: str
) -> None:
    first = claim(store)
    store.record_effect(first, KEY, EFFECT, "intended")
    if earlier == "unknown":
        store.record_effect(first, KEY, EFFECT, "unknown", "timeout")
    later = reclaim(store, first)
    before = snapshot(store.client, store.prefix)
    with pytest.raises(NeedsReconciliation, match="needs reconciliation"):
        apply_effect(store, later, EFFECT, must_not_call)
    assert snapshot(store.client, store.prefix) == before


def test_provider_that_honours_keys_is_sent_the_same_key_again(store: LeaseStore) -> None:
    first = claim(store)
    store.record_effect(first, KEY, EFFECT, "intended")
    later = reclaim(store, first)
    provider = Provider()
    assert apply_effect(store, later, EFFECT, provider.call, honours_keys=True) == {"id": "corr_1"}
    assert provider.calls == [KEY]


@pytest.mark.parametrize(
    "error", [EffectFailed("422 refused"), Throttled("429 slow down", retry_after=2)]
)
def test_definite_failure_is_recorded_and_retried_without_a_lookup(
    store: LeaseStore, error: EffectFailed
) -> None:
    first = claim(store)
    provider = Provider(error=error)
    with pytest.raises(type(error)):
        apply_effect(store, first, EFFECT, provider.call, lookup=provider.lookup)
    record = store.effect(RUN, ITEM, KEY)
    assert record is not None and record["state"] == "failed"
    assert type(error).__name__ in record["error"] and str(error) in record["error"]
    provider.error = None
    assert apply_effect(store, first, EFFECT, provider.call, lookup=must_not_call)
    assert provider.calls == [KEY, KEY]
    assert effects_counts(store) == {
        "effects_intended": 0,
        "effects_failed": 0,
        "effects_applied": 1,
    }


def test_ambiguous_failure_is_unknown_and_aged_until_reconciled(store: LeaseStore) -> None:
    lease = claim(store)
    provider = Provider(error=ConnectionResetError("reset by peer"))
    with pytest.raises(ConnectionResetError):
        apply_effect(store, lease, EFFECT, provider.call, lookup=provider.lookup)
    record = store.effect(RUN, ITEM, KEY)
    assert record is not None and record["state"] == "unknown"
    assert "ConnectionResetError" in record["error"]
    since = record["updated_at"]
    wait_past(store.client, since + 60)
    status = store.status(RUN)
    assert status.events["effects_unknown"] == 1
    assert status.oldest_unknown_effect_age_seconds >= 0.06
    assert status.oldest_unknown_effect_age_seconds <= (server_ms(store.client) - since) / 1000

    provider.found = {"id": "corr_late"}
    assert apply_effect(store, lease, EFFECT, must_not_call, lookup=provider.lookup) == {
        "id": "corr_late"
    }
    status = store.status(RUN)
    assert status.events["effects_unknown"] == 0
    assert status.events["effects_reconciled"] == 1
    assert status.oldest_unknown_effect_age_seconds == 0


def test_lookup_that_cannot_tell_changes_nothing(store: LeaseStore) -> None:
    lease = claim(store)
    store.record_effect(lease, KEY, EFFECT, "intended")
    store.record_effect(lease, KEY, EFFECT, "unknown", "timeout")
    before = snapshot(store.client, store.prefix)

    def blind(key: str) -> Any:
        raise EffectUnknown("lookup answered 503")

    with pytest.raises(EffectUnknown, match="503"):
        apply_effect(store, lease, EFFECT, must_not_call, lookup=blind)
    assert snapshot(store.client, store.prefix) == before


# -- through the worker ----------------------------------------------------------------


def work(store: LeaseStore, handler: Callable[[Item, ActiveLease], Any]) -> ShardReport:
    """One in-process pass of a worker over the item's shard."""
    job = Job("payouts", shards=2, lease_ttl=30, backoff_base=0.01, batch_size=5)
    job.handler(handler)
    keeper = LeaseKeeper(store, 30.0)  # not started: nothing needs renewing here
    shard = store.shard_for(RUN, ITEM)
    stop = threading.Event()
    return work_shard(store, job, RUN, shard, worker="w1", budget=10, stop=stop, keeper=keeper)


def work_until(store: LeaseStore, handler: Any, state: str, passes: int = 200) -> None:
    """Works the shard until the item reaches ``state`` (its backoff polled on the server clock)."""
    for _ in range(passes):
        work(store, handler)
        if store.item(RUN, ITEM).state == state:
            return
        record = store.item(RUN, ITEM)
        if record.state == "pending":
            due = store.client.zscore(store.keys.shard(RUN, record.shard)[3], ITEM)
            wait_past(store.client, int(due or 0))
    raise AssertionError(f"item is {store.item(RUN, ITEM).state}, not {state}")


def test_unreconcilable_effect_makes_the_item_dead(store: LeaseStore) -> None:
    """The first attempt times out; without lookup or key honouring the next one gives up."""
    store.add(RUN, [Item(ITEM, {"account": 7})], shards=2, backoff_base=0.01)
    provider = Provider(error=EffectUnknown("read timed out"))

    def handler(item: Item, lease: ActiveLease) -> Any:
        return lease.effect(EFFECT, provider.call)

    work_until(store, handler, "dead")
    record = store.item(RUN, ITEM)
    assert record.attempts == 2
    assert record.error is not None and "needs reconciliation" in record.error
    assert provider.calls == [KEY]
    ledger = store.effect(RUN, ITEM, KEY)
    assert ledger is not None and ledger["state"] == "unknown"
    assert store.status(RUN).counts["dead"] == 1


def test_throttled_effect_gives_the_item_back_without_counting_an_attempt(
    store: LeaseStore,
) -> None:
    store.add(RUN, [Item(ITEM, {"account": 7})], shards=2)
    provider = Provider(error=Throttled("429", retry_after=0.3))

    def handler(item: Item, lease: ActiveLease) -> Any:
        return lease.effect(EFFECT, provider.call, lookup=provider.lookup)

    before = server_ms(store.client)
    report = work(store, handler)
    assert report.throttled == 1 and report.failed == 0
    record = store.item(RUN, ITEM)
    assert (record.state, record.attempts) == ("pending", 0)
    due = store.client.zscore(store.keys.shard(RUN, record.shard)[3], ITEM)
    assert due is not None and due >= before + 300
    ledger = store.effect(RUN, ITEM, KEY)
    assert ledger is not None and ledger["state"] == "failed"

    provider.error = None
    work_until(store, handler, "done")
    assert store.item(RUN, ITEM).result == {"id": "corr_1"}
    assert provider.calls == [KEY, KEY] and provider.lookups == []
