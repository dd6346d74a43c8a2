"""settle_many and renew_many: one script call per shard, each item fenced on its own."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis

from redis_lease import Item, LeaseLost, LeaseStore, NotFound
from redis_lease.errors import InvalidInput
from redis_lease.protocol.leases import CommitReply, FailReply, FailRequest, ReleaseRequest
from redis_lease.protocol.store.lease_store import CommitRequest
from tests.helpers import records
from tests.redis_server import RedisServer


def _evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_commit_many_sends_one_script_call_per_shard(
    private_redis: Callable[..., RedisServer],
) -> None:
    server = private_redis()
    store = LeaseStore.from_url(server.url, prefix="rl")
    try:
        store.add("r", [Item(f"i{n}", {"n": n}) for n in range(40)], shards=2)
        leases = [lease for shard in (0, 1) for lease in store.claim_next("r", "w", shard=shard,
                  limit=40)]  # fmt: skip
        assert len(leases) == 40
        store.commit_many([CommitRequest(leases[0])])  # loads the scripts it uses
        before = _evalsha_calls(store.client)
        answers = store.commit_many([CommitRequest(lease, {"ok": 1}) for lease in leases[1:]])
        assert _evalsha_calls(store.client) - before == 2, "one call for each of the two shards"
        assert all(isinstance(a, CommitReply) and not a.repeated for a in answers)
        assert store.status("r").counts["done"] == 40
    finally:
        store.client.close()


def test_fails_and_releases_ride_the_same_batch(store: LeaseStore) -> None:
    store.add("r", [Item(f"i{n}") for n in range(5)], shards=1, max_attempts=3)
    a, b, c, d, e = (store.claim("r", f"i{n}", "w", ttl=60) for n in range(5))
    stale = store.lease_ref("r", "i4", e.token + 1)
    answers = store.settle_many(
        [
            CommitRequest(a, {"n": 0}, label="ok"),
            FailRequest(b, "boom"),
            FailRequest(c, "gone for good", permanent=True),
            ReleaseRequest(d, delay=5),
            CommitRequest(stale, {"n": 4}),
            FailRequest(e, ""),
        ]
    )
    assert isinstance(answers[0], CommitReply) and answers[0].result == {"n": 0}
    assert isinstance(answers[1], FailReply) and answers[1].state == "retry"
    assert isinstance(answers[2], FailReply) and answers[2].state == "dead"
    assert answers[3] is None
    assert isinstance(answers[4], LeaseLost) and answers[4].current_token == e.token
    assert isinstance(answers[5], InvalidInput), "an empty error text is refused, not sent"
    states = {n: store.item("r", f"i{n}").state for n in range(5)}
    assert states == {0: "done", 1: "pending", 2: "dead", 3: "pending", 4: "leased"}
    assert store.item("r", "i1").error == "boom"
    assert store.item("r", "i3").attempts == 0, "a release does not count the attempt"
    events = store.status("r").counters
    assert (events["commits"], events["failures"], events["retries"]) == (1, 2, 1)
    assert (events["releases"], events["stale_commits"], events["outcome_ok"]) == (1, 1, 1)


def test_one_item_twice_in_a_batch_is_settled_in_order(store: LeaseStore) -> None:
    store.add("r", [Item("a")])
    lease = store.claim("r", "a", "w")
    first, again, late_fail = store.settle_many(
        [CommitRequest(lease, {"v": 1}), CommitRequest(lease, {"v": 2}), FailRequest(lease, "x")]
    )
    assert isinstance(first, CommitReply) and not first.repeated
    assert isinstance(again, CommitReply) and again.repeated and again.result == {"v": 1}
    assert isinstance(late_fail, LeaseLost), "the item is done: the fail comes too late"


def test_a_missing_item_is_refused_as_a_row(store: LeaseStore) -> None:
    store.add("r", [Item("a")])
    lease = store.claim("r", "a", "w")
    ghost = store.lease_ref("r", "zz", 1)
    ghost = type(ghost)(ghost.run_id, ghost.item_id, lease.shard, 1, "")
    answers = store.commit_many([CommitRequest(ghost), CommitRequest(lease)])
    assert isinstance(answers[0], NotFound) and isinstance(answers[1], CommitReply)


def test_a_bad_argument_refuses_the_whole_call_and_writes_nothing(store: LeaseStore) -> None:
    store.add("r", [Item("a"), Item("b")])
    a, b = store.claim("r", "a", "w"), store.claim("r", "b", "w")
    keys = store.keys.logged("r", 0)
    before = records(store.client, keys[2])
    sha = store.client.script_load(store.scripts["settle"].script)
    good = ["commit", "a", a.token, a.lease_id, "{}", "", ""]
    for bad in (
        ["commit", "b", b.token, b.lease_id, "{not json", "", ""],
        ["fail", "b", b.token, b.lease_id, "x", "2", ""],
        ["renew", "b", b.token, b.lease_id, "0", "", ""],
        ["explode", "b", b.token, b.lease_id, "", "", ""],
        ["release", "b", b.token, b.lease_id, "", "x", ""],
        ["commit", "b", b.token, b.lease_id, "{}", "", "a trace"],
    ):
        with pytest.raises(redis.ResponseError, match=r"^INVALID ARGV\[\d+\]"):
            store.client.evalsha(sha, 8, *keys, *good, *bad)
        assert records(store.client, keys[2]) == before, bad
        assert store.item("r", "a").state == "leased"


def test_renew_many_sends_one_script_call_per_shard(
    private_redis: Callable[..., RedisServer],
) -> None:
    server = private_redis()
    store = LeaseStore.from_url(server.url, prefix="rl")
    try:
        store.add("r", [Item(f"i{n}") for n in range(30)], shards=3)
        leases = store.claim_next("r", "w", limit=30, ttl=1)
        assert len(leases) == 30
        lost = store.lease_ref("r", leases[0].item_id, leases[0].token + 5)
        store.renew_many(leases[:1])  # loads the script
        before = _evalsha_calls(store.client)
        renewed = store.renew_many([*leases, lost], ttl=120)
        assert _evalsha_calls(store.client) - before == 3
        assert renewed[-1] is None
        for old, new in zip(leases, renewed[:-1], strict=True):
            assert new is not None and new.expires_at_ms > old.expires_at_ms
    finally:
        store.client.close()


def test_status_reads_no_script(store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.add("r", [Item(f"i{n}") for n in range(6)], shards=3)
    store.commit(store.claim("r", "i0", "w"))
    monkeypatch.setattr(store.scripts, "many", None)
    status = store.status("r")
    assert status.counts == {"pending": 5, "leased": 0, "done": 1, "dead": 0}
    assert status.counters["commits"] == 1 and status.shards == 3


@pytest.mark.parametrize(
    ("group", "position", "reason"),
    [
        (["commit", "", 1, "", "null", "", ""], 2, "must be 1-200 characters"),
        (["commit", "b c", 1, "", "null", "", ""], 2, "must be 1-200 characters"),
        (["commit", "b" * 201, 1, "", "null", "", ""], 2, "must be 1-200 characters"),
        (["commit", "b", "0", "", "null", "", ""], 3, "must be from 1 to 99999999999999, got 0"),
        (["commit", "b", "1.5", "", "null", "", ""], 3, "must be a whole number, got 1.5"),
        (["commit", "b", "+1", "", "null", "", ""], 3, "must be a whole number, got +1"),
        (["commit", "b", "0x1", "", "null", "", ""], 3, "must be a whole number, got 0x1"),
        (["commit", "b", "1" * 16, "", "null", "", ""], 3, "must be a whole number"),
        (["commit", "b", "1" * 15, "", "null", "", ""], 3, "must be from 1 to 99999999999999"),
        (["commit", "b", 1, "L 1", "null", "", ""], 4, "must be 1-200 characters"),
        (["commit", "b", 1, "", "nul", "", ""], 5, "must be JSON text"),
        (["commit", "b", 1, "", "NULL", "", ""], 5, "must be JSON text"),
        (["commit", "b", 1, "", "01", "", ""], 5, "must be JSON text"),
        (["commit", "b", 1, "", "null", "no label", ""], 6, "must be 1-200 characters"),
        (["release", "b", 1, "", "-1", "", ""], 5, "must be from 0 to 86400000"),
        (["commit", "b", 1, "", "null", "", "a trace"], 7, "must be 1-200 characters"),
    ],
)
def test_settle_names_the_bad_argument_and_why_and_writes_nothing(
    store: LeaseStore, group: list[object], position: int, reason: str
) -> None:
    store.add("r", [Item("a"), Item("b")])
    a = store.claim("r", "a", "w")
    keys = store.keys.logged("r", 0)
    before = records(store.client, keys[2])
    sha = store.client.script_load(store.scripts["settle"].script)
    good = ["commit", "a", a.token, a.lease_id, "null", "", ""]
    with pytest.raises(redis.ResponseError) as info:
        store.client.evalsha(sha, 8, *keys, *good, *group)
    assert str(info.value).startswith(f"INVALID ARGV[{7 + position}] {reason}"), str(info.value)
    assert records(store.client, keys[2]) == before


def test_a_result_text_repeated_in_a_batch_passes_each_time_and_a_bad_one_still_refuses(
    store: LeaseStore,
) -> None:
    store.add("r", [Item(f"i{n}") for n in range(4)])
    leases = [store.claim("r", f"i{n}", "w") for n in range(4)]
    keys = store.keys.logged("r", 0)
    sha = store.client.script_load(store.scripts["settle"].script)

    def group(n: int, result: str) -> list[object]:
        return ["commit", f"i{n}", leases[n].token, leases[n].lease_id, result, "", ""]

    before = records(store.client, keys[2])
    with pytest.raises(redis.ResponseError, match=r"^INVALID ARGV\[19\] must be JSON text"):
        store.client.evalsha(sha, 8, *keys, *group(0, '{"a":1}'), *group(1, '{"a":1}'),
                             *group(2, '{"a":01}'))  # fmt: skip
    assert records(store.client, keys[2]) == before
    rows = store.client.evalsha(
        sha, 8, *keys, *group(0, '{"a":1}'), *group(1, '{"a":1}'), *group(2, "null"),
        *group(3, "null"),
    )  # fmt: skip
    assert [(row[0], row[2]) for row in rows] == [
        (b"committed", b'{"a":1}'),
        (b"committed", b'{"a":1}'),
        (b"committed", b"null"),
        (b"committed", b"null"),
    ]
    assert [store.item("r", f"i{n}").result for n in range(4)] == [{"a": 1}, {"a": 1}, None, None]


def test_a_call_refused_as_a_whole_is_charged_to_the_bad_group_only(store: LeaseStore) -> None:
    """A group the script refuses (here a release delay below zero, which the Python
    client never sends) fails its whole call; each group is then sent alone, so the
    valid commit beside it is done and only the bad group gets InvalidInput."""
    store.add("w", [Item("a"), Item("b")], shards=1)
    by = {lease.item_id: lease for lease in store.claim_next("w", "w1", limit=2)}
    groups = [("commit", by["a"], json.dumps("ok"), ""), ("release", by["b"], -5, "")]
    committed, refused = store._settle(groups)
    assert not isinstance(committed, Exception), committed
    assert isinstance(refused, InvalidInput), refused
    assert store.item("w", "a").state == "done"
    assert store.item("w", "b").state == "leased"
