"""The attempt log (each shard's capped stream of ended attempts), trace ids, the last errors.

Every entry is written by the scripts in the call that ends the attempt (its fields:
lua/include/attempt_log.lua); these tests read it back through ``LeaseStore.attempts`` and
raw XRANGE.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

from redis_lease import InvalidInput, Item, LeaseLost, LeaseStore, NotFound
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.jobs.live_lease import ActiveLease
from redis_lease.fleet.worker.shard_job import LeaseKeeper, work_shard
from redis_lease.limits import ATTEMPT_LOG_CAP, ERROR_HISTORY
from redis_lease.protocol.leases import (
    Attempt,
    FailReply,
    FailRequest,
    Lease,
    ReleaseRequest,
    parse_record,
)
from redis_lease.protocol.tracing import current_trace_id, new_trace_id
from tests.helpers import records, server_ms, snapshot, text, wait_past

RUN = "log"
HEX32 = "[0-9a-f]{32}"


def log_entries(store: LeaseStore, shard: int = 0) -> list[dict[str, str]]:
    """The raw fields of every entry of a shard's attempt log, oldest first."""
    entries: Any = store.client.xrange(store.keys.attempts(RUN, shard))
    return [{text(k): text(v) for k, v in fields.items()} for _, fields in entries]


def record(store: LeaseStore, item: str) -> dict[str, Any]:
    return records(store.client, store.keys.shard(RUN, store.shard_for(RUN, item))[2])[item]


def claim_when_due(store: LeaseStore, item: str, eligible_at_ms: int) -> Lease:
    """Claims ``item`` once the server clock has passed its eligible-at (its backoff)."""
    wait_past(store.client, eligible_at_ms)
    return store.claim(RUN, item, "w2")


def test_a_commit_writes_one_entry_with_its_times_worker_token_and_trace(
    store: LeaseStore,
) -> None:
    store.add(RUN, [Item("a", {"n": 1})], shards=1)
    wait_past(store.client, server_ms(store.client) + 20)  # it waits in the queue a little
    lease = store.claim(RUN, "a", "w1")
    assert re.fullmatch(HEX32, lease.trace_id)
    assert log_entries(store) == [], "a claim writes no entry: the attempt's end does"
    store.commit(lease, {"ok": True}, label="paid")

    [attempt] = store.attempts(RUN, "a")
    rec = record(store, "a")
    assert (attempt.item_id, attempt.attempt, attempt.token, attempt.event) == (
        "a",
        1,
        1,
        "committed",
    )
    assert (attempt.worker, attempt.trace_id, attempt.label, attempt.error) == (
        "w1", lease.trace_id, "paid", None,
    )  # fmt: skip
    assert attempt.queue_age_seconds == (rec["leased_at"] - rec["eligible_at"]) / 1000 >= 0.02
    assert attempt.duration_seconds == (rec["done_at"] - rec["leased_at"]) / 1000
    # Redis reads its clock once per script; the embedded backend reads it on each call
    slack = 250 if store.url.startswith("fakeredis") else 2
    assert abs(round(attempt.at.timestamp() * 1000) - rec["done_at"]) <= slack, "the id's time"
    assert store.attempts(RUN) == [attempt]
    [raw] = log_entries(store)
    assert list(raw) == [
        "item", "attempt", "token", "event", "queue_ms", "run_ms", "worker", "trace", "error",
        "label",
    ], "the documented fields, in order"  # fmt: skip


def test_each_attempt_of_a_retried_item_has_its_entry_and_error(store: LeaseStore) -> None:
    store.add(RUN, [Item("a")], shards=1, max_attempts=3, backoff_base=0.001, backoff_cap=0.001)
    first = store.claim(RUN, "a", "w1")
    failed = store.fail(first, "boom 1")
    second = claim_when_due(store, "a", failed.eligible_at_ms)
    [failed_again] = store.settle_many([FailRequest(second, "boom 2")])
    assert isinstance(failed_again, FailReply) and failed_again.state == "retry"
    third = claim_when_due(store, "a", failed_again.eligible_at_ms)
    store.commit(third)

    attempts = store.attempts(RUN, "a")
    assert [(a.attempt, a.token, a.event, a.error) for a in attempts] == [
        (3, 3, "committed", None),
        (2, 2, "retry", "boom 2"),
        (1, 1, "retry", "boom 1"),
    ]
    assert [a.trace_id for a in attempts] == [third.trace_id, second.trace_id, first.trace_id]
    assert len({a.trace_id for a in attempts}) == 3, "one trace id per attempt"
    assert [a.worker for a in attempts] == ["w2", "w2", "w1"]
    assert all(a.queue_age_seconds is not None and a.queue_age_seconds >= 0 for a in attempts)
    item = store.item(RUN, "a")
    assert item.error == "boom 2"
    assert [(e.error, e.attempt, e.trace_id) for e in item.errors] == [
        ("boom 1", 1, first.trace_id),
        ("boom 2", 2, second.trace_id),
    ]
    assert item.errors[0].at is not None and item.errors[0].at <= item.errors[1].at  # type: ignore[operator]


def test_a_stale_commit_writes_a_refusal_entry_and_nothing_else(store: LeaseStore) -> None:
    store.add(RUN, [Item("a")], shards=1)
    old = store.claim(RUN, "a", "w1", ttl=0.02)
    wait_past(store.client, old.expires_at_ms)
    new = store.claim(RUN, "a", "w2")  # takes the expired lease over
    entries = log_entries(store)
    before = snapshot(store.client, store.prefix)
    counts_key, log_key = store.keys.shard(RUN, 0)[1], store.keys.attempts(RUN, 0)

    with pytest.raises(LeaseLost):
        store.commit(old, {"late": True})

    after = snapshot(store.client, store.prefix)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed <= {counts_key}, f"a refusal changed {changed}"
    assert log_entries(store)[: len(entries)] == entries
    [refusal] = log_entries(store)[len(entries) :]
    assert (refusal["item"], refusal["token"], refusal["event"]) == ("a", "1", "refused")
    assert refusal["trace"] == old.trace_id, "the caller's trace id"
    assert refusal["error"].startswith("LEASE_LOST item=a token=1 current_token=2")
    assert (refusal["attempt"], refusal["worker"], refusal["queue_ms"], refusal["run_ms"]) == (
        "", "", "", "",
    )  # fmt: skip
    assert store.client.xlen(log_key) == len(entries) + 1
    assert store.item(RUN, "a").owner == "w2" and new.token == 2


@pytest.mark.parametrize("operation", ["fail", "release", "renew", "effect"])
def test_every_stale_holder_call_is_logged_as_a_refusal(store: LeaseStore, operation: str) -> None:
    store.add(RUN, [Item("a")], shards=1)
    lease = store.claim(RUN, "a", "w1")
    store.commit(lease)
    calls: dict[str, Callable[[], object]] = {
        "fail": lambda: store.fail(lease, "boom"),
        "release": lambda: store.release(lease),
        "renew": lambda: store.renew(lease),
        "effect": lambda: store.record_effect(lease, "k", "pay", "intended"),
    }
    with pytest.raises(LeaseLost):
        calls[operation]()
    committed, refusal = log_entries(store)
    assert committed["event"] == "committed"
    assert (refusal["event"], refusal["token"], refusal["trace"]) == (
        "refused",
        "1",
        lease.trace_id,
    )
    assert "state=done" in refusal["error"]


def test_takeovers_expiries_and_releases_are_logged(store: LeaseStore) -> None:
    store.add(RUN, [Item("a"), Item("b"), Item("c")], shards=1, max_attempts=2)
    a = store.claim(RUN, "a", "w1", ttl=0.02)
    b = store.claim(RUN, "b", "w1", ttl=0.02)
    wait_past(store.client, max(a.expires_at_ms, b.expires_at_ms))
    [taken] = store.claim_next(RUN, "w2", shard=0, limit=1)  # a or b, the expired lease first
    assert taken.takeover and taken.attempt == 2
    assert store.reap(RUN) == (1, 0)  # the other goes back to pending
    c = store.claim(RUN, "c", "w3")
    [released] = store.settle_many([ReleaseRequest(c)])
    assert released is None

    other = "b" if taken.item_id == "a" else "a"
    events = [
        (e["item"], e["event"], e["attempt"], e["worker"], e["trace"]) for e in log_entries(store)
    ]
    assert events == [
        (taken.item_id, "takeover", "1", "w1", ""),
        (other, "expired", "1", "w1", ""),
        ("c", "released", "1", "w3", c.trace_id),
    ]
    takeover = store.attempts(RUN, taken.item_id)[0]
    assert takeover.duration_seconds is not None and takeover.duration_seconds >= 0.02
    # the taken-over item waited from its old lease's expiry to the claim
    assert store.attempts(RUN, "c")[0].attempt == 1 and store.item(RUN, "c").attempts == 0

    wait_past(store.client, server_ms(store.client))
    last = store.claim(RUN, other, "w4", ttl=0.02)  # its second, last attempt
    wait_past(store.client, last.expires_at_ms)
    assert store.reap(RUN) == (0, 1)
    dead = store.attempts(RUN, other)[0]
    assert (dead.event, dead.attempt, dead.error) == (
        "dead",
        2,
        "lease expired on the last attempt",
    )
    assert store.item(RUN, other).errors[-1].error == "lease expired on the last attempt"


def test_an_item_keeps_its_last_errors(store: LeaseStore) -> None:
    attempts = ERROR_HISTORY + 2
    store.add(RUN, [Item("a")], shards=1, max_attempts=attempts, backoff_base=0.001,
              backoff_cap=0.001)  # fmt: skip
    traces = []
    eligible = 0
    for n in range(1, attempts + 1):
        lease = claim_when_due(store, "a", eligible)
        traces.append(lease.trace_id)
        eligible = store.fail(lease, f"boom {n}").eligible_at_ms
    item = store.item(RUN, "a")
    assert item.state == "dead" and item.error == f"boom {attempts}"
    kept = range(attempts - ERROR_HISTORY + 1, attempts + 1)
    assert [(e.error, e.attempt) for e in item.errors] == [(f"boom {n}", n) for n in kept]
    assert [e.trace_id for e in item.errors] == traces[-ERROR_HISTORY:]
    assert record(store, "a")["error"] == f"boom {attempts}"
    assert [e.to_dict()["error"] for e in record(store, "a")["errors"]] == [
        f"boom {n}" for n in kept
    ]


def test_a_record_of_a_form_only_releases_before_0_9_0_wrote_is_refused() -> None:
    """0.9.0 and later write the 12-field packed form: the 11-field form and the JSON
    object of earlier releases are no longer read."""
    for old in ('pending||||||||||{"s":"a|b"}', json.dumps({"state": "pending", "token": 1})):
        with pytest.raises(ValueError, match="not an item record"):
            parse_record(old)


@pytest.mark.real_redis_only("approximate stream trimming works as on a real server")
def test_the_log_stays_capped_and_an_item_is_found_below_the_newest_page(
    real_store: LeaseStore,
) -> None:
    store = real_store
    store.add(RUN, [Item("a"), Item("b")], shards=1)
    b = store.claim(RUN, "b", "w")
    store.commit(b)
    a = store.claim(RUN, "a", "w")
    stale = Lease.from_token(RUN, "a", 0, a.token + 1)
    assert store.renew_many([stale] * 1_200) == [None] * 1_200  # 1,200 refusal entries
    [found] = store.attempts(RUN, "b")  # three pages of 500 down
    assert (found.event, found.trace_id) == ("committed", b.trace_id)
    assert len(store.attempts(RUN, "a", limit=1_000)) == 1_000

    node = int(text(store.client.config_get("stream-node-max-entries")["stream-node-max-entries"]))
    store.renew_many([stale] * ATTEMPT_LOG_CAP)
    length = store.client.xlen(store.keys.attempts(RUN, 0))
    assert ATTEMPT_LOG_CAP <= length <= ATTEMPT_LOG_CAP + node, length
    assert store.attempts(RUN, "b") == [], "trimmed: the log keeps the newest entries"
    assert store.attempts(RUN, limit=1)[0].event == "refused"


def test_attempts_reads_every_shard_newest_first_and_checks_its_arguments(
    store: LeaseStore,
) -> None:
    store.add(RUN, [Item(f"i{n}") for n in range(8)], shards=4)
    leases = store.claim_next(RUN, "w", limit=8)
    for lease in leases:
        store.commit(lease)
    everything = store.attempts(RUN, limit=100)
    assert sorted(a.item_id for a in everything) == [f"i{n}" for n in range(8)]
    assert len({store.shard_for(RUN, a.item_id) for a in everything}) > 1
    order = [tuple(int(p) for p in a.entry_id.split("-")) for a in everything]
    assert order == sorted(order, reverse=True)
    assert store.attempts(RUN, limit=3) == everything[:3]
    assert store.attempts(RUN, "nobody") == []
    with pytest.raises(InvalidInput, match="limit"):
        store.attempts(RUN, limit=0)
    with pytest.raises(InvalidInput, match="item id"):
        store.attempts(RUN, "a b")
    with pytest.raises(NotFound):
        store.attempts("no-such-run")
    assert everything[0].to_dict()["trace_id"] == everything[0].trace_id


def test_the_handler_sees_the_trace_id_the_log_records(store: LeaseStore) -> None:
    seen: dict[str, str] = {}
    job = Job("traced", shards=1, lease_ttl_seconds=30, batch_size=5)

    @job.handler
    def handle(item: Item, lease: ActiveLease) -> None:
        seen[item.id] = lease.trace_id

    store.add(RUN, [Item("a"), Item("b")], shards=1)
    report = work_shard(store, job, RUN, 0, worker="w", budget=30, stop=threading.Event(),
                        keeper=LeaseKeeper(store, 30))  # fmt: skip
    assert report.committed == 2
    logged = {a.item_id: a.trace_id for a in store.attempts(RUN)}
    assert logged == seen and len(set(seen.values())) == 2
    assert all(re.fullmatch(HEX32, t) for t in seen.values())


def test_without_a_current_span_each_attempt_gets_a_new_trace_id(store: LeaseStore) -> None:
    assert current_trace_id() is None, "no span is current here"
    store.add(RUN, [Item("a"), Item("b")], shards=1)
    leases = store.claim_next(RUN, "w", limit=2)
    traces = [lease.trace_id for lease in leases]
    assert len(set(traces)) == 2 and all(re.fullmatch(HEX32, t) for t in traces)
    assert new_trace_id() not in traces


def test_with_a_current_opentelemetry_span_the_trace_id_is_the_spans(store: LeaseStore) -> None:
    trace = pytest.importorskip("opentelemetry.trace")
    span_context = trace.SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    store.add(RUN, [Item("a"), Item("b")], shards=1)
    with trace.use_span(trace.NonRecordingSpan(span_context)):
        lease = store.claim(RUN, "a", "w")
    outside = store.claim(RUN, "b", "w")
    store.commit(lease)
    store.commit(outside)
    assert lease.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert store.attempts(RUN, "a")[0].trace_id == lease.trace_id
    assert outside.trace_id != lease.trace_id, "outside the span: a new id"


def test_a_bad_trace_id_is_refused_before_anything_is_sent(store: LeaseStore) -> None:
    store.add(RUN, [Item("a")], shards=1)
    lease = store.claim(RUN, "a", "w")
    bad = Lease(lease.run_id, lease.item_id, lease.shard, lease.token, lease.lease_id,
                trace_id="not a trace")  # fmt: skip
    with pytest.raises(InvalidInput, match="trace id"):
        store.commit(bad)
    [refused] = store.settle_many([ReleaseRequest(bad)])
    assert isinstance(refused, InvalidInput)
    assert store.item(RUN, "a").state == "leased" and log_entries(store) == []


def test_attempt_entries_decode_as_written() -> None:
    entry = Attempt.from_entry(
        b"1700000000123-4",
        {b"item": b"a", b"attempt": b"2", b"token": b"5", b"event": b"retry", b"queue_ms": b"1500",
         b"run_ms": b"", b"worker": b"w", b"trace": b"t", b"error": b"boom", b"label": b""},
    )  # fmt: skip
    assert (entry.attempt, entry.token, entry.queue_age_seconds, entry.duration_seconds) == (
        2, 5, 1.5, None,
    )  # fmt: skip
    assert entry.to_dict()["at"] == "2023-11-14T22:13:20.123+00:00"
