"""The fencing story: a holder that lost its lease can finish its process but never commit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from redis_lease import Item, Lease, LeaseLost, LeaseStore, RunStatus, Write
from redis_lease.protocol.guards import FieldEquals
from tests.helpers import snapshot, wait_past

RUN = "fence:2026-12-02"
SHORT = 0.05  # seconds: a lease meant to expire during the test


def keys_but_counts(store: LeaseStore) -> dict[str, object]:
    """Every key under the store's prefix except the counters and the attempt log (refusals
    are counted and logged: tests/test_attempt_log.py checks the entry)."""
    return {
        k: v
        for k, v in snapshot(store.client, store.prefix).items()
        if not k.endswith((":counts", ":attempts"))
    }


def states(status: RunStatus) -> tuple[dict[str, int], dict[str, int]]:
    """The state counts and the event counters other than those of refused stale writes."""
    events = {k: v for k, v in status.counters.items() if not k.startswith("stale_")}
    return status.counts, events


def test_a_stale_holder_is_refused_everything_and_the_new_holder_commits(
    store: LeaseStore,
) -> None:
    store.add(RUN, [Item("acct_42:cursor_9", {"version": 3})], shards=4)
    a = store.claim(RUN, "acct_42:cursor_9", worker="A", ttl=SHORT)
    assert (a.token, a.attempt, a.takeover) == (1, 1, False)
    wait_past(store.client, a.expires_at_ms)

    b = store.claim(RUN, "acct_42:cursor_9", worker="B", ttl=60)
    assert b.token > a.token and b.takeover and b.attempt == 2
    assert b.payload == {"version": 3}

    record, status, keys = store.item(RUN, a.item_id), store.status(RUN), keys_but_counts(store)
    assert (record.state, record.token, record.owner, record.lease_id) == (
        "leased",
        b.token,
        "B",
        b.lease_id,
    )
    guard = f"{store.prefix}:{{{RUN}#{a.shard}}}:seat"
    refusals: list[Callable[[], object]] = [
        lambda: store.commit(a, {"by": "A"}, writes=[Write.hset(guard, {"held": "A"})]),
        lambda: store.renew(a, ttl=60),
        lambda: store.fail(a, "A gave up"),
        lambda: store.fail(a, "A gave up", permanent=True),
        lambda: store.release(a),
    ]
    for attempt in refusals:
        with pytest.raises(LeaseLost) as info:
            attempt()
        assert info.value.current_token == b.token
        assert (info.value.run_id, info.value.item_id, info.value.token) == (RUN, a.item_id, 1)
        assert "lease lost" in info.value.message

    assert store.item(RUN, a.item_id) == record
    after = store.status(RUN)
    assert states(after) == states(status)
    assert after.counters["stale_refused"] == status.counters.get("stale_refused", 0) + len(
        refusals
    )
    assert after.counters["stale_commits"] == status.counters.get("stale_commits", 0) + 1
    assert keys_but_counts(store) == keys
    assert store.client.exists(guard) == 0

    outcome = store.commit(b, {"by": "B"}, writes=[Write.hset(guard, {"held": "B"})])
    assert (outcome.token, outcome.result, outcome.repeated) == (b.token, {"by": "B"}, False)
    assert store.client.hget(guard, "held") == b"B"
    again = store.commit(b, {"by": "B, again"}, writes=[Write.hset(guard, {"held": "B2"})])
    assert again == replace(outcome, repeated=True)
    assert store.client.hget(guard, "held") == b"B", "a repeated commit writes nothing"

    done = store.item(RUN, a.item_id)
    assert (done.state, done.result, done.token) == ("done", {"by": "B"}, b.token)
    with pytest.raises(LeaseLost):
        store.commit(a, {"by": "A"})
    assert store.item(RUN, a.item_id) == done
    counts, _ = states(store.status(RUN))
    assert counts == {"pending": 0, "leased": 0, "done": 1, "dead": 0}


def test_an_expired_lease_cannot_commit_even_before_a_takeover(store: LeaseStore) -> None:
    store.add(RUN, [Item("x")])
    a = store.claim(RUN, "x", worker="A", ttl=SHORT)
    wait_past(store.client, a.expires_at_ms)
    before = store.item(RUN, "x")
    with pytest.raises(LeaseLost):
        store.commit(a, "late")
    with pytest.raises(LeaseLost):
        store.renew(a)
    assert store.item(RUN, "x") == before
    b = store.claim(RUN, "x", worker="B")
    assert b.token == a.token + 1 and b.takeover


def test_renew_extends_only_for_the_holder(store: LeaseStore) -> None:
    store.add(RUN, [Item("x")])
    a = store.claim(RUN, "x", worker="A", ttl=5)
    renewed = store.renew(a, ttl=120)
    assert renewed.expires_at_ms > a.expires_at_ms
    assert renewed.token == a.token and renewed.lease_id == a.lease_id
    assert store.item(RUN, "x").expires_at_ms == renewed.expires_at_ms

    impostors = [
        replace(a, token=a.token + 1),
        replace(a, lease_id="someone-else"),
        replace(a, token=a.token + 1, lease_id=""),
    ]
    for impostor in impostors:
        with pytest.raises(LeaseLost):
            store.renew(impostor, ttl=600)
    assert store.item(RUN, "x").expires_at_ms == renewed.expires_at_ms
    # the token alone (a lease kept by token, as on a command line) proves the holder
    by_token = store.lease_ref(RUN, "x", a.token)
    assert store.renew(by_token, ttl=60).expires_at_ms < renewed.expires_at_ms


def test_a_wrong_lease_id_with_the_right_token_is_lease_lost(store: LeaseStore) -> None:
    store.add(RUN, [Item("x")])
    real = store.claim(RUN, "x", worker="A", ttl=60)
    fake: Lease = replace(real, lease_id="0" * 32)
    before_item, before_keys = store.item(RUN, "x"), keys_but_counts(store)
    for attempt in (
        lambda: store.commit(fake, "forged"),
        lambda: store.renew(fake),
        lambda: store.fail(fake, "forged"),
        lambda: store.release(fake),
    ):
        with pytest.raises(LeaseLost) as info:
            attempt()
        assert info.value.current_token == real.token
    assert store.item(RUN, "x") == before_item
    assert keys_but_counts(store) == before_keys
    assert store.commit(real, "genuine").result == "genuine"


def test_guarded_writes_of_a_stale_holder_never_apply(store: LeaseStore) -> None:
    store.add(RUN, [Item("hold_7")])
    shard = store.shard_for(RUN, "hold_7")
    seat = f"{store.prefix}:{{{RUN}#{shard}}}:seat:7"
    store.client.hset(seat, mapping={"hold": "hold_7", "version": "3"})
    a = store.claim(RUN, "hold_7", worker="A", ttl=SHORT)
    wait_past(store.client, a.expires_at_ms)
    b = store.claim(RUN, "hold_7", worker="B", ttl=60)
    conditions = [FieldEquals(seat, "version", 3)]
    writes = [Write.hdel(seat, ["hold"]), Write.hset(seat, {"version": 4})]
    with pytest.raises(LeaseLost):
        store.commit(a, "released", conditions=conditions, writes=writes)
    assert store.client.hgetall(seat) == {b"hold": b"hold_7", b"version": b"3"}
    store.commit(b, "released", conditions=conditions, writes=writes)
    assert store.client.hgetall(seat) == {b"version": b"4"}


def test_the_token_never_goes_back(store: LeaseStore) -> None:
    store.add(RUN, [Item("x")], max_attempts=2)
    tokens = []
    lease = store.claim(RUN, "x", worker="w")
    tokens.append(lease.token)
    store.release(lease)
    lease = store.claim(RUN, "x", worker="w")
    tokens.append(lease.token)
    store.fail(lease, "gone", permanent=True)
    assert store.requeue(RUN, ["x"]) == 1
    lease = store.claim(RUN, "x", worker="w", ttl=SHORT)
    tokens.append(lease.token)
    wait_past(store.client, lease.expires_at_ms)
    lease = store.claim(RUN, "x", worker="w")
    tokens.append(lease.token)
    assert tokens == sorted(set(tokens)) and tokens[0] >= 1
    assert store.item(RUN, "x").token == tokens[-1]
