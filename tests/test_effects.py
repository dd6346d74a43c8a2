"""The effect ledger: idempotency keys, fenced transitions, reconciliation before re-issue.

Runs on real Redis and on fakeredis (the ``store`` fixture). Provider calls and
lookups are plain functions here; tests/test_transitions.py runs the same paths
against the HTTP provider with real worker processes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from redis_lease import (
    InvalidInput,
    Item,
    LeaseLost,
    LeaseStore,
    NotClaimable,
    NotFound,
    RunClosed,
    SlotTimeout,
)
from redis_lease.fleet.effects.ledger import (
    KEY_MAX_LENGTH,
    EffectFailed,
    EffectUnknown,
    NeedsReconciliation,
    Throttled,
    apply_effect,
    idempotency_key,
    not_sent,
    resolve_effect,
)
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.worker.shard_job import ActiveLease, LeaseKeeper, ShardReport, work_shard
from redis_lease.protocol.keys import shard_of
from redis_lease.protocol.leases import COUNT_STATES, Lease
from redis_lease.protocol.replies import Snapshot
from redis_lease.protocol.store import run_status
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
    events = store.status(RUN).counters
    return {k: v for k, v in events.items() if k.startswith("effects_")}


def error_text(record: dict[str, Any]) -> Any:
    """A ledger record's error, kept as JSON text like its result."""
    return json.loads(record["error"])


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
    with pytest.raises(NeedsReconciliation, match="needs reconciliation") as raised:
        apply_effect(store, later, EFFECT, must_not_call)
    assert snapshot(store.client, store.prefix) == before
    message = str(raised.value)
    assert "token 1" in message  # the attempt it comes from, and how that one ended
    assert ("ended: timeout" in message) == (earlier == "unknown")
    assert f"'redis-lease requeue {RUN} {ITEM}'" in message and "lookup=" in message
    assert f"resolve_effect(store, {RUN!r}, {ITEM!r}, {EFFECT!r}, applied=...)" in message


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
    with pytest.raises(EffectUnknown) as raised:
        apply_effect(store, lease, EFFECT, provider.call, lookup=provider.lookup)
    assert raised.value.__cause__ is provider.error  # the original, chained
    assert "ConnectionResetError: reset by peer" in str(raised.value)
    record = store.effect(RUN, ITEM, KEY)
    assert record is not None and record["state"] == "unknown"
    assert error_text(record) == "ConnectionResetError: reset by peer"
    since = record["updated_at"]
    wait_past(store.client, since + 60)
    status = store.status(RUN)
    assert status.counters["effects_unknown"] == 1
    assert status.oldest_unknown_effect_age_seconds >= 0.06
    assert status.oldest_unknown_effect_age_seconds <= (server_ms(store.client) - since) / 1000

    provider.found = {"id": "corr_late"}
    assert apply_effect(store, lease, EFFECT, must_not_call, lookup=provider.lookup) == {
        "id": "corr_late"
    }
    status = store.status(RUN)
    assert status.counters["effects_unknown"] == 0
    assert status.counters["effects_reconciled"] == 1
    assert status.oldest_unknown_effect_age_seconds == 0


def test_the_shard_status_script_and_a_runs_status_read_a_shard_alike(store: LeaseStore) -> None:
    """shard_status.lua (what a client in any language reads) and the status pipeline (plain
    reads, for a read-only user) give one shard the same counts and first entries, the
    unknown effects' too."""
    lease = claim(store)
    shard = lease.shard
    keys = store.keys.status(RUN, shard)

    def both_alike() -> Snapshot:
        script = store.scripts.call("shard_status", keys, [])
        _, shards = run_status.read(store, RUN)
        pipeline = shards[shard]
        assert {**script.counts, **{s: 0 for s in COUNT_STATES if s not in script.counts}} == (
            pipeline.counts
        )
        assert (script.first_due_ms, script.first_held_ms, script.first_unknown_ms) == (
            pipeline.first_due_ms, pipeline.first_held_ms, pipeline.first_unknown_ms,
        )  # fmt: skip
        assert type(script) is type(pipeline) is Snapshot
        return script

    assert both_alike().first_unknown_ms is None
    provider = Provider(error=ConnectionResetError("reset by peer"))
    with pytest.raises(EffectUnknown):
        apply_effect(store, lease, EFFECT, provider.call, lookup=provider.lookup)
    record = store.effect(RUN, ITEM, KEY)
    assert record is not None and record["state"] == "unknown"
    others = [f"o{n}" for n in range(12)]
    store.add(RUN, [Item(i) for i in others])
    mine = [i for i in others if shard_of(i, 2) == shard]
    assert len(mine) >= 3, "the other items reach this shard"
    store.fail(store.claim(RUN, mine[0], "w2"), "no", permanent=True)
    store.commit(store.claim(RUN, mine[1], "w2"), "ok")
    snapshot = both_alike()
    assert snapshot.first_unknown_ms == record["updated_at"]
    assert snapshot.counts["dead"] == 1 and snapshot.counts["done"] == 1
    assert snapshot.counts["leased"] == 1 and snapshot.counts["pending"] >= 1
    assert snapshot.first_due_ms is not None and snapshot.first_held_ms is not None


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
    """One in-process pass of a worker over the item's shard (it ends once nothing is due)."""
    job = Job("payouts", shards=2, lease_ttl_seconds=30, backoff_base_seconds=0.01, batch_size=5)
    job.handler(handler)
    keeper = LeaseKeeper(store, 30.0)  # not started: nothing needs renewing here
    shard = store.shard_for(RUN, ITEM)
    stop = threading.Event()
    return work_shard(
        store,
        job,
        RUN,
        shard,
        worker="w1",
        budget=10,
        stop=stop,
        keeper=keeper,
        wait_for_backoff=False,
    )


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
    """The first attempt times out; without lookup or key honouring it gives up at once,
    keeping the provider's error and saying how to settle the effect."""
    store.add(RUN, [Item(ITEM, {"account": 7})], shards=2, backoff_base=0.01)
    provider = Provider(error=EffectUnknown("read timed out"))

    def handler(item: Item, lease: ActiveLease) -> Any:
        return lease.effect(EFFECT, provider.call)

    work_until(store, handler, "dead")
    record = store.item(RUN, ITEM)
    assert record.attempts == 1
    assert record.error is not None and "needs reconciliation" in record.error
    assert "EffectUnknown: read timed out" in record.error
    assert "lookup=" in record.error and f"redis-lease requeue {RUN} {ITEM}" in record.error
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


# -- what a call's error means ---------------------------------------------------------


class ConnectError(Exception):
    """Named like httpx's: raised before the request is written."""


class NewConnectionError(OSError):
    """Named like urllib3's."""


class MaxRetryError(Exception):
    """Like urllib3's: keeps the last error as ``reason``."""

    def __init__(self, reason: BaseException) -> None:
        super().__init__("max retries exceeded")
        self.reason = reason


def raised_from(error: BaseException, cause: BaseException) -> BaseException:
    """``error`` as raised by ``raise error from cause``."""
    error.__cause__ = cause
    return error


def wrapped_by_context(error: BaseException, context: BaseException) -> BaseException:
    """``error`` raised while ``context`` was being handled (no ``from``)."""
    error.__context__ = context
    return error


NOT_SENT = {
    "refused": ConnectionRefusedError(111, "Connection refused"),
    "no such host": socket.gaierror(-2, "Name or service not known"),
    "httpx connect": raised_from(ConnectError("All connection attempts failed"), OSError(111)),
    "requests-like": ConnectionError(MaxRetryError(NewConnectionError("Failed to establish"))),
}
MAYBE_SENT = {
    "timeout": TimeoutError("timed out"),
    "reset": ConnectionResetError(104, "Connection reset by peer"),
    "5xx": RuntimeError("provider answered 502"),
    "retried after a refusal": wrapped_by_context(
        TimeoutError("read timed out"), ConnectionRefusedError(111, "refused")
    ),
    "said unknown though refused": raised_from(
        EffectUnknown("no answer"), ConnectionRefusedError(111, "refused")
    ),
}


@pytest.mark.parametrize("name", NOT_SENT)
def test_an_error_before_any_connection_shows_nothing_was_sent(name: str) -> None:
    assert not_sent(NOT_SENT[name])


@pytest.mark.parametrize("name", [n for n in MAYBE_SENT if n != "said unknown though refused"])
def test_an_error_after_a_connection_may_have_been_sent(name: str) -> None:
    assert not not_sent(MAYBE_SENT[name])


def test_a_cycle_of_wrapped_errors_ends() -> None:
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__cause__, second.__cause__ = second, first
    assert not not_sent(first)


@pytest.mark.parametrize("name", NOT_SENT)
def test_an_effect_never_sent_is_retried_and_sent_by_the_next_attempt(
    store: LeaseStore, name: str
) -> None:
    """Defaults (no lookup, keys not honoured): the item is retried, not sent dead.

    The backoff (at least half a second) keeps the retry out of the first pass."""
    store.add(RUN, [Item(ITEM, {"account": 7})], shards=2, backoff_base=1.0)
    error = NOT_SENT[name]
    provider = Provider(error=error)

    def handler(item: Item, lease: ActiveLease) -> Any:
        return lease.effect(EFFECT, provider.call)

    report = work(store, handler)
    assert report.failed == 1
    record = store.item(RUN, ITEM)
    assert (record.state, record.attempts) == ("pending", 1)
    original = f"{type(error).__name__}: {error}"
    assert record.error is not None and original in record.error  # the original kept
    assert record.error.startswith("EffectFailed: ")
    ledger = store.effect(RUN, ITEM, KEY)
    assert ledger is not None
    assert (ledger["state"], error_text(ledger)) == ("failed", f"not sent: {original}")

    provider.error = None
    work_until(store, handler, "done")
    assert store.item(RUN, ITEM).result == {"id": "corr_1"}
    assert provider.calls == [KEY, KEY]
    assert effects_counts(store) == {
        "effects_intended": 0,
        "effects_failed": 0,
        "effects_applied": 1,
    }


def test_an_async_effect_never_sent_is_retried_too(store: LeaseStore) -> None:
    """effect_async classifies the same way: the coroutine's error reaches the ledger as is."""
    store.add(RUN, [Item(ITEM, {"account": 7})], shards=2, backoff_base=1.0)
    refused: list[BaseException] = [ConnectionRefusedError(111, "Connection refused")]
    calls: list[str] = []

    async def call(key: str) -> Any:
        calls.append(key)
        if refused:
            raise refused.pop()
        return {"id": "corr_async"}

    async def handler(item: Item, lease: ActiveLease) -> Any:
        return await lease.effect_async(EFFECT, call)

    assert work(store, handler).failed == 1
    record = store.item(RUN, ITEM)
    assert record.state == "pending" and record.error is not None
    assert "was not sent: ConnectionRefusedError" in record.error
    work_until(store, handler, "done")
    assert store.item(RUN, ITEM).result == {"id": "corr_async"}
    assert calls == [KEY, KEY]


def test_a_definite_refusal_is_retried_by_the_worker_with_its_error_kept(
    store: LeaseStore,
) -> None:
    """The ledger says nothing was applied: the next attempt sends, no lookup needed."""
    store.add(RUN, [Item(ITEM, {"account": 7})], shards=2, backoff_base=1.0)
    provider = Provider(error=EffectFailed("422 account frozen"))

    def handler(item: Item, lease: ActiveLease) -> Any:
        return lease.effect(EFFECT, provider.call)

    assert work(store, handler).failed == 1
    record = store.item(RUN, ITEM)
    assert (record.state, record.error) == ("pending", "EffectFailed: 422 account frozen")
    provider.error = None
    work_until(store, handler, "done")
    assert provider.calls == [KEY, KEY]


def test_a_not_sent_error_is_chained_to_what_the_handler_sees(store: LeaseStore) -> None:
    lease = claim(store)
    refused = ConnectionRefusedError(111, "Connection refused")
    with pytest.raises(EffectFailed, match="was not sent: ConnectionRefusedError") as raised:
        apply_effect(store, lease, EFFECT, Provider(error=refused).call)
    assert raised.value.__cause__ is refused
    assert (raised.value.run_id, raised.value.item_id, raised.value.token) == (RUN, ITEM, 1)


@pytest.mark.parametrize("name", MAYBE_SENT)
def test_an_outcome_that_may_be_applied_needs_reconciliation_at_once_with_its_cause(
    store: LeaseStore, name: str
) -> None:
    lease = claim(store)
    error = MAYBE_SENT[name]
    with pytest.raises(NeedsReconciliation) as raised:
        apply_effect(store, lease, EFFECT, Provider(error=error).call)
    assert raised.value.__cause__ is error
    message = str(raised.value)
    assert f"({type(error).__name__}: {error})" in message
    assert "lookup=" in message and "honours_keys=True" in message
    assert f"'redis-lease requeue {RUN} {ITEM}'" in message
    ledger = store.effect(RUN, ITEM, KEY)
    assert ledger is not None
    assert (ledger["state"], error_text(ledger)) == ("unknown", f"{type(error).__name__}: {error}")


@pytest.mark.parametrize("reconcile", ["lookup", "honours_keys"])
def test_an_outcome_that_may_be_applied_is_retried_when_it_can_be_reconciled(
    store: LeaseStore, reconcile: str
) -> None:
    store.add(RUN, [Item(ITEM, {"account": 7})], shards=2, backoff_base=1.0)
    timeout = TimeoutError("read timed out")
    provider = Provider(error=timeout)
    options: dict[str, Any] = (
        {"lookup": provider.lookup} if reconcile == "lookup" else {"honours_keys": True}
    )
    seen: list[BaseException] = []

    def handler(item: Item, lease: ActiveLease) -> Any:
        try:
            return lease.effect(EFFECT, provider.call, **options)
        except Exception as error:
            seen.append(error)
            raise

    assert work(store, handler).failed == 1
    assert isinstance(seen[0], EffectUnknown) and seen[0].__cause__ is timeout
    record = store.item(RUN, ITEM)
    assert record.state == "pending" and record.error is not None
    assert (
        record.error.startswith("EffectUnknown: ")
        and "TimeoutError: read timed out" in record.error
    )
    provider.error = None
    work_until(store, handler, "done")
    if reconcile == "lookup":  # it was not applied: asked, then sent again with the key
        assert provider.lookups == [KEY]
    assert provider.calls == [KEY, KEY]


def test_a_huge_error_message_is_clipped_in_the_ledger_not_refused(store: LeaseStore) -> None:
    lease = claim(store)
    error = RuntimeError("\x01" * 100_000)  # escaped as \u0001: 600 KB of JSON
    with pytest.raises(NeedsReconciliation) as raised:
        apply_effect(store, lease, EFFECT, Provider(error=error).call)
    assert raised.value.__cause__ is error
    ledger = store.effect(RUN, ITEM, KEY)
    assert ledger is not None and ledger["state"] == "unknown"
    assert error_text(ledger).startswith("RuntimeError: \x01") and len(error_text(ledger)) < 5000


def test_a_stop_during_the_call_is_unknown_and_raised_as_it_is(store: LeaseStore) -> None:
    lease = claim(store)
    stop = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as raised:
        apply_effect(store, lease, EFFECT, Provider(error=stop).call)
    assert raised.value is stop
    ledger = store.effect(RUN, ITEM, KEY)
    assert ledger is not None and ledger["state"] == "unknown"


def test_a_lost_lease_during_the_call_stays_a_lost_lease(store: LeaseStore) -> None:
    lease = claim(store)
    lost = LeaseLost("lost meanwhile", run_id=RUN, item_id=ITEM, token=1)
    with pytest.raises(LeaseLost) as raised:
        apply_effect(store, lease, EFFECT, Provider(error=lost).call)
    assert raised.value is lost


def test_a_slot_timeout_inside_the_call_means_nothing_was_sent(store: LeaseStore) -> None:
    lease = claim(store)
    with pytest.raises(SlotTimeout):
        apply_effect(store, lease, EFFECT, Provider(error=SlotTimeout("no slot in 5s")).call)
    ledger = store.effect(RUN, ITEM, KEY)
    assert ledger is not None and ledger["state"] == "failed"


# -- an operator settles an unknown effect ----------------------------------------------


def dead_after_a_timeout(store: LeaseStore) -> Provider:
    """The item's effect timed out and, with no lookup, the item is dead."""
    store.add(RUN, [Item(ITEM, {"account": 7})], shards=2, backoff_base=0.01)
    provider = Provider(error=TimeoutError("read timed out"))
    work_until(store, lambda item, lease: lease.effect(EFFECT, provider.call), "dead")
    return provider


def test_an_effect_the_provider_applied_is_resolved_and_never_sent_again(
    store: LeaseStore,
) -> None:
    provider = dead_after_a_timeout(store)
    record = resolve_effect(store, RUN, ITEM, EFFECT, applied=True, result={"id": "corr_7"})
    assert (record["state"], record["result"]) == ("applied", {"id": "corr_7"})
    assert store.item(RUN, ITEM).state == "pending"
    work_until(store, lambda item, lease: lease.effect(EFFECT, must_not_call), "done")
    assert store.item(RUN, ITEM).result == {"id": "corr_7"}
    assert provider.calls == [KEY]
    assert effects_counts(store)["effects_reconciled"] == 1


def test_an_effect_the_provider_never_applied_is_resolved_and_sent_once(
    store: LeaseStore,
) -> None:
    provider = dead_after_a_timeout(store)
    record = resolve_effect(store, RUN, ITEM, EFFECT, applied=False, worker="ops-anna")
    assert (record["state"], error_text(record)) == ("failed", "not applied: ops-anna")
    provider.error = None
    work_until(store, lambda item, lease: lease.effect(EFFECT, provider.call), "done")
    assert provider.calls == [KEY, KEY]


def test_resolving_an_effect_that_is_not_open_changes_nothing(store: LeaseStore) -> None:
    lease = claim(store)
    with pytest.raises(NotFound, match="no record"):
        resolve_effect(store, RUN, ITEM, EFFECT, applied=True)
    apply_effect(store, lease, EFFECT, Provider().call)
    store.commit(lease, result={"ok": True})
    before = snapshot(store.client, store.prefix)
    with pytest.raises(InvalidInput, match="is applied, not unknown"):
        resolve_effect(store, RUN, ITEM, EFFECT, applied=False)
    assert snapshot(store.client, store.prefix) == before


def test_resolving_an_effect_whose_item_a_worker_holds_is_refused(store: LeaseStore) -> None:
    lease = claim(store)
    store.record_effect(lease, KEY, EFFECT, "intended")
    before = snapshot(store.client, store.prefix)
    with pytest.raises(NotClaimable):
        resolve_effect(store, RUN, ITEM, EFFECT, applied=True)
    assert snapshot(store.client, store.prefix) == before


def test_resolving_an_effect_of_a_closed_run_writes_nothing(store: LeaseStore) -> None:
    dead_after_a_timeout(store)
    store.set_closed(RUN, True)
    before = snapshot(store.client, store.prefix)
    with pytest.raises(RunClosed, match="resume it first"):
        resolve_effect(store, RUN, ITEM, EFFECT, applied=True)
    assert snapshot(store.client, store.prefix) == before
    assert store.item(RUN, ITEM).state == "dead"


# -- a lease that ran out by the process's own clock ------------------------------------


def test_a_lease_run_out_by_the_local_clock_sends_nothing(store: LeaseStore) -> None:
    """No renewal got through for a whole TTL (Redis stalled, the process paused): the
    server may have given the item to another holder, so no effect is sent."""
    provider = Provider()
    active = ActiveLease(store, claim(store), ttl=30.0, sent_at=time.monotonic() - 31.0)
    with pytest.raises(LeaseLost):
        active.effect(EFFECT, provider.call, lookup=provider.lookup)
    assert provider.calls == [] and active.lost
    assert store.effect(RUN, ITEM, KEY) is None  # stopped before recording an intent


def test_a_lease_that_runs_out_after_the_intent_is_recorded_sends_nothing(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = Provider()
    active = ActiveLease(store, claim(store), ttl=30.0)
    recorded = store.begin_effect

    def begin_then_stall(*args: Any, **kwargs: Any) -> Any:
        answer = recorded(*args, **kwargs)
        active.valid_until = time.monotonic()  # the process stalls past its lease here
        return answer

    monkeypatch.setattr(store, "begin_effect", begin_then_stall)
    with pytest.raises(EffectFailed, match="not sent: the lease"):
        active.effect(EFFECT, provider.call, lookup=provider.lookup)
    assert provider.calls == []
    record = store.effect(RUN, ITEM, KEY)
    assert record is not None and record["state"] == "failed"  # the next attempt sends it


def test_an_async_call_whose_lease_ran_out_while_the_loop_was_busy_is_not_started(
    store: LeaseStore,
) -> None:
    started: list[str] = []
    active = ActiveLease(store, claim(store), ttl=30.0)

    async def send(key: str) -> Any:
        started.append(key)
        return {"id": "corr_1"}

    def call(key: str) -> Any:
        active.valid_until = time.monotonic()  # runs out before the loop gets to it
        return send(key)

    async def handler() -> Any:
        return await active.effect_async(EFFECT, call)

    with pytest.raises(EffectFailed, match="not sent: the lease"):
        asyncio.run(handler())
    assert started == []
    record = store.effect(RUN, ITEM, KEY)
    assert record is not None and record["state"] == "failed"
