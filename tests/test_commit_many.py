"""commit_many: several fenced commits in one round trip, each settled on its own."""

from __future__ import annotations

from dataclasses import replace

from redis_lease import ConditionFailed, FieldEquals, Item, LeaseLost, LeaseStore
from redis_lease.protocol.store.lease_store import CommitRequest
from tests.helpers import wait_past


def test_each_commit_is_fenced_on_its_own(store: LeaseStore) -> None:
    store.add("r", [Item(f"i{n}") for n in range(4)], shards=2)
    leases = [store.claim("r", f"i{n}", "w", ttl=60) for n in range(3)]
    stale = store.claim("r", "i3", "w", ttl=0.02)
    wait_past(store.client, stale.expires_at_ms)
    guard_key = f"{store.prefix}:{{r#{leases[1].shard}}}:guard"  # the shard's hash tag
    store.client.hset(guard_key, "v", "1")
    answers = store.commit_many(
        [
            CommitRequest(leases[0], {"n": 0}),
            CommitRequest(leases[1], {"n": 1}, conditions=(FieldEquals(guard_key, "v", "2"),)),
            CommitRequest(leases[2], {"n": 2}, label="released"),
            CommitRequest(stale, {"n": 3}),
        ]
    )
    assert [type(a).__name__ for a in answers] == [
        "CommitReply",
        "ConditionFailed",
        "CommitReply",
        "LeaseLost",
    ]
    assert isinstance(answers[1], ConditionFailed) and isinstance(answers[3], LeaseLost)
    states = {n: store.item("r", f"i{n}").state for n in range(4)}
    assert states == {0: "done", 1: "leased", 2: "done", 3: "leased"}
    assert store.item("r", "i0").result == {"n": 0}
    assert store.status("r").counters["outcome_released"] == 1
    # Repeating the batch returns the stored outcomes of those that were committed.
    again = store.commit_many([CommitRequest(leases[0], {"n": 9})])
    assert getattr(again[0], "repeated", False) and getattr(again[0], "result", None) == {"n": 0}


def test_a_bad_request_is_answered_and_not_sent(store: LeaseStore) -> None:
    store.add("r", [Item("a"), Item("b"), Item("c")])
    good = store.claim("r", "a", "w")
    # lease_ref refuses a bad token itself, so the bad request is made from a good ref
    bad_token = replace(store.lease_ref("r", "b", 1), token=0)
    held = store.claim("r", "c", "w")
    answers = store.commit_many(
        [CommitRequest(good), CommitRequest(bad_token), CommitRequest(held, {"x": object()})]
    )
    assert [type(a).__name__ for a in answers] == ["CommitReply", "InvalidInput", "InvalidInput"]
    assert store.item("r", "a").state == "done"
    assert store.item("r", "b").state == "pending"
    assert store.item("r", "c").state == "leased", "the unencodable result was not sent"
    assert store.commit_many([]) == []
