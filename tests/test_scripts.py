"""Each Lua script called directly with raw KEYS/ARGV: its reply and the keys it leaves.

Runs on real Redis and on fakeredis (the ``store`` fixture); only the store's
client, key names and registered scripts are used, never its Python logic.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from redis_lease import LeaseStore
from redis_lease.protocol.scripts import KEY_COUNTS
from tests.helpers import dump_key, records, server_ms, snapshot, text, wait_past

RUN = "run-1"


class Shard:
    """Shard 0 of one run, driven through raw script calls."""

    def __init__(self, store: LeaseStore) -> None:
        self.client = store.client
        self.scripts = store.scripts
        self.prefix = store.prefix
        self.keys = store.keys.shard(RUN, 0)
        self.logged = store.keys.logged(RUN, 0)  # the keys of the scripts that end attempts
        self.meta_key, self.counts_key, self.items_key = self.keys[:3]
        self.due_key, self.leases_key, self.held_key, self.dead_key = self.keys[3:]
        self.attempts_key = self.logged[7]
        self.status_keys = store.keys.status(RUN, 0)
        self.tag = f"{store.prefix}:{{{RUN}#0}}"

    def call(self, name: str, *args: Any, extra: Sequence[str] = ()) -> Any:
        keys = self.logged if KEY_COUNTS[name] >= 8 else self.keys
        if name == "shard_status":  # the seven and the unknown effects
            keys = self.status_keys
        return text(self.scripts.run(name, [*keys, *extra], list(args)))

    def error(self, name: str, *args: Any, extra: Sequence[str] = ()) -> tuple[str, dict[str, str]]:
        """Runs a script that must answer an error reply; returns its code and fields."""
        with pytest.raises(redis.ResponseError) as info:
            self.call(name, *args, extra=extra)
        code, _, detail = str(info.value).partition(" ")
        return code, dict(part.split("=", 1) for part in detail.split() if "=" in part)

    def add(
        self,
        *ids: str,
        max_attempts: int = 3,
        base_ms: int = 1000,
        cap_ms: int = 60000,
        payload: str = '{"n":1}',
    ) -> Any:
        flat = [part for item in ids for part in (item, payload)]
        return self.call("add_items", RUN, 0, max_attempts, base_ms, cap_ms, 0, *flat)

    def claim(self, item: str, ttl: int = 60000, worker: str = "w1", lease_id: str = "L1") -> Any:
        return self.call("claim", item, worker, lease_id, ttl)

    def record(self, item: str) -> dict[str, Any]:
        return records(self.client, self.items_key)[item]

    def zset(self, key: str) -> dict[str, float]:
        pairs: Any = self.client.zrange(key, 0, -1, withscores=True)
        return {text(m): s for m, s in pairs}

    def counts(self) -> dict[str, int]:
        """The shard's counters and its index sizes (pending, leased, dead), leaving out zeros.

        ``added`` (the run's accounting of items added) is left out too: its own test checks it.
        """
        raw = self.client.hgetall(self.counts_key)
        counts = {text(k): int(v) for k, v in raw.items()}
        prefix = self.counts_key.removesuffix("counts")
        for state, index in (("pending", "due"), ("leased", "leases"), ("dead", "dead")):
            counts[state] = int(self.client.zcard(prefix + index))
        return {name: value for name, value in counts.items() if value != 0 and name != "added"}

    def meta(self) -> dict[str, str]:
        return {text(k): text(v) for k, v in self.client.hgetall(self.meta_key).items()}

    def snapshot(self) -> dict[str, Any]:
        return snapshot(self.client, self.prefix)

    def expire(self, item: str) -> int:
        """Waits until the item's lease has expired on the server clock."""
        return wait_past(self.client, int(self.record(item)["expires_at"]))


@pytest.fixture
def sh(store: LeaseStore) -> Shard:
    return Shard(store)


def unrefused(keys_snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot without the counters of refused stale writes (``stale_*``) and without the
    attempt log, where a refusal is logged (tests/test_attempt_log.py checks its entries)."""
    copy = {key: value for key, value in keys_snapshot.items() if not key.endswith(":attempts")}
    for key, value in copy.items():
        if key.endswith(":counts") and value is not None:
            copy[key] = ("hash", {f: v for f, v in value[1].items() if not f.startswith("stale_")})
    return copy


# -- add_items ----------------------------------------------------------------


def test_add_items_flags_new_and_existing_and_sets_meta_once(sh: Shard) -> None:
    before = server_ms(sh.client)
    assert sh.add("a", "b", payload='{"v":1}') == [1, 1]
    assert sh.add("b", "c", payload='{"v":2}', max_attempts=9, base_ms=5, cap_ms=6) == [0, 1]
    after = server_ms(sh.client)

    recs = records(sh.client, sh.items_key)
    assert set(recs) == {"a", "b", "c"}
    assert recs["b"]["payload"] == '{"v":1}', "an existing item must be left alone"
    assert recs["c"]["payload"] == '{"v":2}'
    due = sh.zset(sh.due_key)
    assert set(due) == set(recs), "due at once, when added"
    for item, rec in recs.items():
        assert rec["state"] == "pending"
        assert before <= due[item] <= after
        assert "token" not in rec and "attempts" not in rec
    for key in (sh.leases_key, sh.held_key, sh.dead_key):
        assert dump_key(sh.client, key) is None
    assert sh.counts() == {"pending": 3}
    assert sh.meta() == {
        "run": RUN,
        "shard": "0",
        "max_attempts": "3",
        "backoff_base_ms": "1000",
        "backoff_cap_ms": "60000",
        "deadline_at": "0",
        "created_at": str(int(due["a"])),
    }
    assert int(text(sh.client.hget(sh.counts_key, "added"))) == 3, "added counts new items once"


def test_add_items_on_a_closed_shard_is_refused_and_writes_nothing(sh: Shard) -> None:
    assert sh.call("close_shard", "1") == 1
    before = sh.snapshot()
    assert sh.error("add_items", RUN, 0, 3, 1000, 60000, 0, "a", "{}") == (
        "RUN_CLOSED",
        {"run": RUN, "reason": "closed", "deadline": "0"},
    )
    assert sh.snapshot() == before


# -- claim --------------------------------------------------------------------


def test_claim_of_a_pending_due_item(sh: Shard) -> None:
    sh.add("a", payload='{"x":42}')
    row = sh.claim("a", ttl=60000, worker="w1", lease_id="L1")
    item, token, lease_id, expires, attempt, payload, takeover, now = row
    assert (item, token, lease_id, attempt, payload, takeover) == ("a", 1, "L1", 1, '{"x":42}', 0)
    assert expires == now + 60000

    rec = sh.record("a")
    assert rec["state"] == "leased"
    assert (rec["token"], rec["lease_id"], rec["owner"], rec["attempts"]) == (1, "L1", "w1", 1)
    assert (rec["leased_at"], rec["expires_at"]) == (now, expires)
    assert sh.zset(sh.due_key) == {}
    assert sh.zset(sh.leases_key) == {"a": float(expires)}
    assert sh.zset(sh.held_key) == {"a": float(now)}
    assert sh.counts() == {"leased": 1, "claims": 1}


def test_claim_of_an_item_not_yet_due_names_its_eligible_time(sh: Shard) -> None:
    sh.add("a", base_ms=60000, cap_ms=60000)
    sh.claim("a")
    status, eligible, _attempts, now = sh.call("fail", "a", 1, "L1", "boom", "0", 0)
    assert status == "retry" and eligible == now + 30000
    before = sh.snapshot()
    assert sh.error("claim", "a", "w2", "L2", 1000) == (
        "NOT_CLAIMABLE",
        {"item": "a", "state": "pending", "until": str(eligible)},
    )
    assert sh.snapshot() == before


def test_claim_of_an_item_leased_by_another_names_the_holders_expiry(sh: Shard) -> None:
    sh.add("a")
    expires = sh.claim("a", ttl=60000)[3]
    before = sh.snapshot()
    assert sh.error("claim", "a", "w2", "L2", 1000) == (
        "NOT_CLAIMABLE",
        {"item": "a", "state": "leased", "until": str(expires)},
    )
    assert sh.snapshot() == before


def test_claim_of_an_expired_lease_is_a_takeover_with_the_next_token(sh: Shard) -> None:
    sh.add("a")
    first = sh.claim("a", ttl=30)
    sh.expire("a")
    item, token, lease_id, expires, attempt, _payload, takeover, now = sh.claim(
        "a", ttl=60000, worker="w2", lease_id="L2"
    )
    assert (item, token, lease_id, attempt, takeover) == ("a", first[1] + 1, "L2", 2, 1)
    assert now > first[3] and expires == now + 60000
    rec = sh.record("a")
    assert (rec["state"], rec["token"], rec["owner"], rec["lease_id"]) == ("leased", 2, "w2", "L2")
    assert sh.zset(sh.leases_key) == {"a": float(expires)}
    assert sh.zset(sh.held_key) == {"a": float(now)}
    assert sh.counts() == {"leased": 1, "claims": 2, "expired": 1, "takeovers": 1}


def test_claim_of_a_lease_expired_on_its_last_attempt_sends_it_dead(sh: Shard) -> None:
    sh.add("a", max_attempts=1)
    sh.claim("a", ttl=30)
    sh.expire("a")
    assert sh.error("claim", "a", "w2", "L2", 1000) == (
        "NOT_CLAIMABLE",
        {"item": "a", "state": "dead", "until": "0"},
    )
    rec = sh.record("a")
    assert (rec["state"], rec["token"], rec["error"]) == (
        "dead",
        1,
        "lease expired on the last attempt",
    )
    assert "expires_at" not in rec, "a dead item has no lease expiry"
    assert list(sh.zset(sh.dead_key)) == ["a"]
    assert sh.zset(sh.leases_key) == {} and sh.zset(sh.held_key) == {}
    assert sh.counts() == {"dead": 1, "claims": 1, "expired": 1}


def test_claim_of_a_done_item_is_refused(sh: Shard) -> None:
    sh.add("a")
    sh.claim("a")
    sh.call("commit", "a", 1, "L1", '"ok"', "[]", "[]")
    before = sh.snapshot()
    assert sh.error("claim", "a", "w2", "L2", 1000) == (
        "NOT_CLAIMABLE",
        {"item": "a", "state": "done", "until": "0"},
    )
    assert sh.snapshot() == before


def test_claim_of_a_missing_item_is_not_found_and_writes_nothing(sh: Shard) -> None:
    assert sh.error("claim", "nope", "w1", "L1", 1000) == ("NOT_FOUND", {"item": "nope"})
    assert sh.snapshot() == {}


def test_claim_on_a_closed_shard_is_refused(sh: Shard) -> None:
    sh.add("a")
    sh.call("close_shard", "1")
    before = sh.snapshot()
    assert sh.error("claim", "a", "w1", "L1", 1000) == (
        "RUN_CLOSED",
        {"run": RUN, "reason": "closed", "deadline": "0"},
    )
    assert sh.snapshot() == before


# -- claim_next -----------------------------------------------------------------


def test_claim_next_takes_expired_leases_first_then_eligible_order_up_to_limit(
    sh: Shard,
) -> None:
    sh.add("m")
    sh.claim("m", ttl=30)
    first = sh.add("z")
    assert first == [1]
    wait_past(sh.client, int(sh.zset(sh.due_key)["z"]))
    sh.add("a")
    assert sh.zset(sh.due_key)["a"] > sh.zset(sh.due_key)["z"]
    sh.expire("m")

    rows = sh.call("claim_next", "w2", "B", 60000, 2)
    assert [(r[0], r[1], r[2], r[4], r[6]) for r in rows] == [
        ("m", 2, "B.1", 2, 1),  # the expired lease, taken over
        ("z", 1, "B.2", 1, 0),  # then the earliest eligible, though 'a' sorts first
    ]
    for row in rows:
        assert row[3] == row[7] + 60000
    assert set(sh.zset(sh.due_key)) == {"a"}

    rest = sh.call("claim_next", "w3", "C", 60000, 5)
    assert [(r[0], r[2]) for r in rest] == [("a", "C.1")]
    assert sh.call("claim_next", "w3", "D", 60000, 5) == []
    assert sh.counts() == {"leased": 3, "claims": 4, "expired": 1, "takeovers": 1}


def test_claim_next_refuses_a_lease_id_base_whose_ids_would_be_too_long(sh: Shard) -> None:
    """Every lease id claim_next grants is an id its holder can renew and commit with."""
    sh.add("a")
    before = sh.snapshot()
    code, _ = sh.error("claim_next", "w", "b" * 195, 60000, 1)
    assert code == "INVALID"
    assert sh.snapshot() == before
    (row,) = sh.call("claim_next", "w", "b" * 194, 60000, 1)
    assert len(row[2]) <= 200
    assert sh.call("renew", "a", row[1], row[2], 60000)[0] > 0


def test_claim_next_skips_items_not_due_and_finished(sh: Shard) -> None:
    sh.add("later", "done", "due", base_ms=60000, cap_ms=60000)
    sh.claim("later")
    sh.call("fail", "later", 1, "L1", "retry me", "0", 0)
    sh.claim("done", lease_id="L2")
    sh.call("commit", "done", 1, "L2", "null", "[]", "[]")
    rows = sh.call("claim_next", "w", "B", 60000, 10)
    assert [r[0] for r in rows] == ["due"]
    assert sh.record("later")["state"] == "pending" and sh.record("done")["state"] == "done"


def test_claim_next_sends_a_lease_expired_on_its_last_attempt_dead_and_fills_up(
    sh: Shard,
) -> None:
    sh.add("last", max_attempts=1)
    sh.claim("last", ttl=20)
    sh.expire("last")
    sh.add("fresh")
    rows = sh.call("claim_next", "w2", "B", 60000, 1)
    assert [(r[0], r[1], r[2], r[6]) for r in rows] == [("fresh", 1, "B.1", 0)]
    rec = sh.record("last")
    assert (rec["state"], rec["error"]) == ("dead", "lease expired on the last attempt")
    assert "expires_at" not in rec
    assert set(sh.zset(sh.dead_key)) == {"last"} and set(sh.zset(sh.leases_key)) == {"fresh"}
    assert sh.counts() == {"leased": 1, "dead": 1, "claims": 2, "expired": 1}


def test_claim_next_removes_only_the_items_it_took_from_the_due_index(sh: Shard) -> None:
    sh.add("a", "b", "c", "d", "e", base_ms=60000, cap_ms=60000)
    sh.add("later")
    sh.claim("later")
    sh.call("fail", "later", 1, "L1", "retry me", "0", 0)  # due again in a minute
    due = sh.zset(sh.due_key)
    rows = sh.call("claim_next", "w", "B", 60000, 3)
    assert [r[0] for r in rows] == ["a", "b", "c"]
    assert sh.zset(sh.due_key) == {k: v for k, v in due.items() if k in ("d", "e", "later")}
    assert set(sh.zset(sh.leases_key)) == set(sh.zset(sh.held_key)) == {"a", "b", "c"}
    rows = sh.call("claim_next", "w", "C", 60000, 5)
    assert [r[0] for r in rows] == ["d", "e"]
    assert set(sh.zset(sh.due_key)) == {"later"}
    assert sh.counts() == {"pending": 1, "leased": 5, "claims": 6, "failures": 1, "retries": 1}


def test_claim_next_drops_orphans_and_stray_entries_among_the_due_items(sh: Shard) -> None:
    sh.add("a", "b", "c", "d", "e")
    sh.claim("c")
    first = min(sh.zset(sh.due_key).values())
    sh.client.zadd(sh.due_key, {"c": first - 1})  # a stray entry at the head: c is leased
    sh.client.hdel(sh.items_key, "b")  # an orphan: its record vanished
    rows = sh.call("claim_next", "w", "B", 60000, 2)  # the range read: c, a
    assert [r[0] for r in rows] == ["a"]
    assert set(sh.zset(sh.due_key)) == {"b", "d", "e"}, "the stray went, the rest stayed"
    rows = sh.call("claim_next", "w", "C", 60000, 10)
    assert [r[0] for r in rows] == ["d", "e"]
    assert sh.zset(sh.due_key) == {}
    assert set(sh.zset(sh.leases_key)) == set(sh.zset(sh.held_key)) == {"a", "c", "d", "e"}
    assert sh.counts() == {"leased": 4, "claims": 4, "lost": 1}


def test_claim_next_on_a_closed_shard_is_refused(sh: Shard) -> None:
    sh.add("a")
    sh.call("close_shard", "1")
    before = sh.snapshot()
    assert sh.error("claim_next", "w", "B", 60000, 10)[0] == "RUN_CLOSED"
    assert sh.snapshot() == before


# -- renew ------------------------------------------------------------------------


def test_renew_by_the_holder_moves_the_expiry_only(sh: Shard) -> None:
    sh.add("a")
    _, _, _, first_expiry, _, _, _, leased_at = sh.claim("a", ttl=1000)
    expires, now = sh.call("renew", "a", 1, "L1", 90000)
    assert expires == now + 90000 and expires > first_expiry
    rec = sh.record("a")
    assert (rec["expires_at"], rec["leased_at"], rec["token"]) == (expires, leased_at, 1)
    assert sh.zset(sh.leases_key) == {"a": float(expires)}
    assert sh.zset(sh.held_key) == {"a": float(leased_at)}, "the lease start does not move"
    assert sh.counts() == {"leased": 1, "claims": 1, "renewals": 1}
    # the token alone ('' lease id) also proves the holder
    assert sh.call("renew", "a", 1, "", 1000)[0] < expires


@pytest.mark.parametrize(
    ("token", "lease_id", "reason"), [(2, "L1", "token"), (1, "other", "lease")], ids=str
)
def test_renew_by_a_non_holder_is_lease_lost(
    sh: Shard, token: int, lease_id: str, reason: str
) -> None:
    sh.add("a")
    sh.claim("a")
    before = sh.snapshot()
    code, fields = sh.error("renew", "a", token, lease_id, 90000)
    assert code == "LEASE_LOST"
    assert fields == {
        "item": "a",
        "token": str(token),
        "current_token": "1",
        "state": "leased",
        "reason": reason,
        "expires_at": str(sh.record("a")["expires_at"]),
    }
    assert unrefused(sh.snapshot()) == unrefused(before)
    assert sh.counts()["stale_refused"] == 1


def test_renew_of_an_expired_lease_is_lease_lost(sh: Shard) -> None:
    sh.add("a")
    sh.claim("a", ttl=30)
    sh.expire("a")
    before = sh.snapshot()
    assert sh.error("renew", "a", 1, "L1", 90000)[0] == "LEASE_LOST"
    assert unrefused(sh.snapshot()) == unrefused(before)


def test_renew_of_a_missing_item_is_not_found(sh: Shard) -> None:
    assert sh.error("renew", "nope", 1, "", 1000) == ("NOT_FOUND", {"item": "nope"})
    assert sh.snapshot() == {}


# -- commit -----------------------------------------------------------------------


def test_commit_by_the_holder_marks_done(sh: Shard) -> None:
    sh.add("a")
    sh.claim("a")
    status, token, result, done_at = sh.call("commit", "a", 1, "L1", '{"r":1}', "[]", "[]")
    assert (status, token, result) == ("committed", 1, '{"r":1}')
    rec = sh.record("a")
    assert (rec["state"], rec["result"], rec["done_at"], rec["token"]) == (
        "done",
        '{"r":1}',
        done_at,
        1,
    )
    assert "expires_at" not in rec
    for key in (sh.due_key, sh.leases_key, sh.held_key, sh.dead_key):
        assert dump_key(sh.client, key) is None
    assert sh.counts() == {"done": 1, "claims": 1, "commits": 1}


def test_repeated_commit_returns_the_stored_outcome_and_writes_nothing(sh: Shard) -> None:
    sh.add("a")
    sh.claim("a")
    guard = f"{sh.tag}:g:h"
    first = sh.call("commit", "a", 1, "L1", '{"r":1}', "[]", "[]")
    before = sh.snapshot()
    writes = json.dumps([{"do": "hset", "key": 1, "fields": {"f": "v"}}])
    again = sh.call("commit", "a", 1, "L1", '{"r":"other"}', "[]", writes, extra=[guard])
    assert again == ["repeated", 1, '{"r":1}', first[3]]
    assert sh.call("commit", "a", 1, "", "null", "[]", "[]") == again
    assert sh.snapshot() == before


def test_commit_with_a_stale_token_is_lease_lost_and_changes_nothing(sh: Shard) -> None:
    sh.add("a")
    sh.claim("a", ttl=30)
    sh.expire("a")
    sh.claim("a", worker="w2", lease_id="L2")
    guard = f"{sh.tag}:g:h"
    before = sh.snapshot()
    writes = json.dumps([{"do": "hset", "key": 1, "fields": {"f": "v"}}])
    code, fields = sh.error("commit", "a", 1, "L1", '"late"', "[]", writes, extra=[guard])
    assert (code, fields) == (
        "LEASE_LOST",
        {
            "item": "a",
            "token": "1",
            "current_token": "2",
            "state": "leased",
            "reason": "token",
            "expires_at": str(sh.record("a")["expires_at"]),
        },
    )
    assert unrefused(sh.snapshot()) == unrefused(before)
    assert sh.client.exists(guard) == 0
    assert (sh.counts()["stale_refused"], sh.counts()["stale_commits"]) == (1, 1)


def test_commit_of_an_expired_lease_without_takeover_is_lease_lost(sh: Shard) -> None:
    sh.add("a")
    sh.claim("a", ttl=30)
    sh.expire("a")
    before = sh.snapshot()
    assert sh.error("commit", "a", 1, "L1", "null", "[]", "[]")[0] == "LEASE_LOST"
    assert unrefused(sh.snapshot()) == unrefused(before)


def test_commit_with_a_wrong_lease_id_is_lease_lost(sh: Shard) -> None:
    sh.add("a")
    sh.claim("a")
    before = sh.snapshot()
    assert sh.error("commit", "a", 1, "L9", "null", "[]", "[]")[0] == "LEASE_LOST"
    assert unrefused(sh.snapshot()) == unrefused(before)


def test_commit_applies_guarded_writes_of_every_kind_when_conditions_hold(sh: Shard) -> None:
    h, s, z, k, new = (f"{sh.tag}:g:{n}" for n in ("h", "s", "z", "k", "new"))
    sh.client.hset(h, mapping={"version": "7", "old": "x", "keep": "1"})
    sh.client.sadd(s, "m1", "m2")
    sh.client.zadd(z, {"z1": 1, "z2": 2})
    sh.client.set(k, "v")
    sh.add("a")
    sh.claim("a")
    conditions = [
        {"if": "equals", "key": 1, "field": "version", "value": "7"},
        {"if": "equals", "key": 1, "field": "version", "value": 7},  # compared as text
        {"if": "exists", "key": 4},
        {"if": "missing", "key": 5},
    ]
    writes = [
        {"do": "hset", "key": 1, "fields": {"version": "8", "new": "n"}},
        {"do": "hdel", "key": 1, "fields": ["old"]},
        {"do": "sadd", "key": 2, "members": ["m3"]},
        {"do": "srem", "key": 2, "members": ["m1"]},
        {"do": "zadd", "key": 3, "scores": {"z3": 3.5}},
        {"do": "zrem", "key": 3, "members": ["z1"]},
        {"do": "del", "key": 4},
        {"do": "hset", "key": 5, "fields": {"f": "v"}},
    ]
    guards = [json.dumps(conditions), json.dumps(writes)]
    reply = sh.call("commit", "a", 1, "L1", "null", *guards, extra=[h, s, z, k, new])
    assert reply[0] == "committed"
    assert dump_key(sh.client, h) == ("hash", {"version": "8", "new": "n", "keep": "1"})
    assert dump_key(sh.client, s) == ("set", {"m2", "m3"})
    assert dump_key(sh.client, z) == ("zset", {"z2": 2.0, "z3": 3.5})
    assert dump_key(sh.client, k) is None
    assert dump_key(sh.client, new) == ("hash", {"f": "v"})
    assert sh.record("a")["state"] == "done"


@pytest.mark.parametrize(
    "failing",
    [
        {"if": "equals", "key": 1, "field": "version", "value": "6"},
        {"if": "equals", "key": 1, "field": "absent", "value": ""},
        {"if": "exists", "key": 2},
        {"if": "missing", "key": 1},
    ],
    ids=["equals-other-value", "equals-absent-field", "exists", "missing"],
)
def test_commit_with_a_failed_condition_writes_nothing_and_keeps_the_lease(
    sh: Shard, failing: dict[str, Any]
) -> None:
    h, absent = f"{sh.tag}:g:h", f"{sh.tag}:g:absent"
    sh.client.hset(h, "version", "7")
    sh.add("a")
    sh.claim("a")
    conditions = [{"if": "exists", "key": 1}, failing]
    writes = [{"do": "hset", "key": 1, "fields": {"version": "8"}}, {"do": "del", "key": 1}]
    before = sh.snapshot()
    guards = [json.dumps(conditions), json.dumps(writes)]
    assert sh.error("commit", "a", 1, "L1", "null", *guards, extra=[h, absent]) == (
        "CONDITION_FAILED",
        {"item": "a", "condition": "2"},
    )
    assert sh.snapshot() == before
    assert sh.call("commit", "a", 1, "L1", "null", "[]", "[]")[0] == "committed"


@pytest.mark.parametrize(
    ("conditions", "writes", "message"),
    [
        ("not json", "[]", "must be a JSON array"),
        ("[]", "{", "must be a JSON array"),
        ('"text"', "[]", "must be a JSON array"),
        ("[]", "7", "must be a JSON array"),
        ('[{"if": "like", "key": 1}]', "[]", 'condition 1 needs "if"'),
        ('["exists"]', "[]", 'condition 1 needs "if"'),
        ('[{"if": "exists", "key": 1}, {"if": "exists", "key": 2}]', "[]", "condition 2 names"),
        ('[{"if": "exists", "key": 0}]', "[]", "condition 1 names key 0"),
        ('[{"if": "exists"}]', "[]", "condition 1 names key nil"),
        ('[{"if": "exists", "key": "1"}]', "[]", "condition 1 names key 1"),
        (
            '[{"if": "equals", "key": 1, "value": "x"}]',
            "[]",
            "needs a string field and a string or number value",
        ),
        (
            '[{"if": "equals", "key": 1, "field": "f"}]',
            "[]",
            "needs a string field and a string or number value",
        ),
        ("[]", '[{"do": "incr", "key": 1}]', 'write 1 needs "do"'),
        ("[]", '[{"do": "hset", "key": 1, "fields": {}}]', 'needs a non-empty object "fields"'),
        ("[]", '[{"do": "sadd", "key": 1}]', 'needs a non-empty array "members"'),
        ("[]", '[{"do": "zadd", "key": 1, "scores": "x"}]', 'needs a non-empty object "scores"'),
        ("[]", '[{"do": "del", "key": 2}]', "write 1 names key 2 of 1 guarded keys"),
        (
            "[]",
            '[{"do": "hset", "key": 1, "fields": {"a": "b"}},'
            ' {"do": "zadd", "key": 1, "scores": {"m": "high"}}]',
            "write 2",
        ),
    ],
)
def test_commit_with_invalid_guards_is_invalid_and_writes_nothing(
    sh: Shard, conditions: str, writes: str, message: str
) -> None:
    h = f"{sh.tag}:g:h"
    sh.client.hset(h, "version", "7")
    sh.add("a")
    sh.claim("a")
    before = sh.snapshot()
    with pytest.raises(redis.ResponseError) as info:
        sh.call("commit", "a", 1, "L1", "null", conditions, writes, extra=[h])
    assert str(info.value).startswith("INVALID ")
    assert message in str(info.value)
    assert sh.snapshot() == before


@pytest.mark.parametrize(
    "writes",
    [
        [
            {"do": "sadd", "key": 2, "members": ["m1"]},
            {"do": "hset", "key": 2, "fields": {"a": "b"}},
        ],
        [{"do": "sadd", "key": 3, "members": ["m"]}, {"do": "zrem", "key": 1, "members": ["m"]}],
        [
            {"do": "hset", "key": 3, "fields": {"a": "b"}},
            {"do": "sadd", "key": 3, "members": ["m"]},
        ],
    ],
    ids=["hash-write-on-a-set", "zset-write-on-a-hash", "set-write-on-a-new-hash"],
)
def test_commit_with_a_write_to_a_key_of_another_type_writes_nothing(
    sh: Shard, writes: list[dict[str, Any]]
) -> None:
    h, s, new = f"{sh.tag}:g:h", f"{sh.tag}:g:s", f"{sh.tag}:g:new"
    sh.client.hset(h, "version", "7")
    sh.client.sadd(s, "m0")
    sh.add("a")
    sh.claim("a")
    before = sh.snapshot()
    with pytest.raises(redis.ResponseError) as info:
        sh.call("commit", "a", 1, "L1", "null", "[]", json.dumps(writes), extra=[h, s, new])
    assert str(info.value).startswith("INVALID write 2 needs a ")
    assert sh.snapshot() == before
    # a delete first makes the key free for another type
    ok = [{"do": "del", "key": 1}, {"do": "sadd", "key": 1, "members": ["m"]}]
    assert (
        sh.call("commit", "a", 1, "L1", "null", "[]", json.dumps(ok), extra=[h])[0] == "committed"
    )
    assert dump_key(sh.client, h) == ("set", {"m"})


def test_commit_of_a_missing_item_is_not_found(sh: Shard) -> None:
    assert sh.error("commit", "nope", 1, "", "null", "[]", "[]") == ("NOT_FOUND", {"item": "nope"})
    assert sh.snapshot() == {}


# -- fail -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "jitter", "delay"),
    [(1, 0, 20), (1, 0.5, 30), (1, 0.999, 39), (2, 0, 30), (2, 0.5, 45), (3, 0.999, 59)],
)
def test_fail_retries_after_backoff_from_meta(
    sh: Shard, attempt: int, jitter: float, delay: int
) -> None:
    # base 40 ms doubling per attempt, capped at 60 ms; delay = backoff * (0.5 + jitter / 2)
    sh.add("a", max_attempts=5, base_ms=40, cap_ms=60)
    for _ in range(attempt - 1):
        sh.claim("a", ttl=20)
        sh.expire("a")
    token = sh.claim("a", ttl=60000)[1]
    assert token == attempt
    status, eligible, attempts, now = sh.call("fail", "a", token, "L1", "provider 503", "0", jitter)
    assert (status, attempts) == ("retry", attempt)
    assert eligible - now == delay
    rec = sh.record("a")
    assert (rec["state"], rec["error"], rec["attempts"], rec["token"]) == (
        "pending",
        "provider 503",
        attempt,
        attempt,
    )
    assert "expires_at" not in rec
    assert sh.zset(sh.due_key) == {"a": float(eligible)}
    assert sh.zset(sh.leases_key) == {} and sh.zset(sh.held_key) == {}
    assert sh.counts()["failures"] == 1 and sh.counts()["retries"] == 1
    assert sh.counts()["pending"] == 1 and "leased" not in sh.counts()


def test_fail_at_max_attempts_goes_dead(sh: Shard) -> None:
    sh.add("a", max_attempts=2, base_ms=1, cap_ms=1)
    sh.claim("a", ttl=20)
    sh.expire("a")
    sh.claim("a", lease_id="L2")
    status, eligible, attempts, now = sh.call("fail", "a", 2, "L2", "still broken", "0", 0.3)
    assert (status, eligible, attempts) == ("dead", 0, 2)
    rec = sh.record("a")
    assert (rec["state"], rec["error"]) == ("dead", "still broken")
    assert sh.zset(sh.dead_key) == {"a": float(now)}
    assert sh.zset(sh.due_key) == {} and sh.zset(sh.leases_key) == {}
    assert sh.counts() == {"dead": 1, "claims": 2, "expired": 1, "takeovers": 1, "failures": 1}


def test_permanent_fail_goes_dead_at_once(sh: Shard) -> None:
    sh.add("a", max_attempts=5)
    sh.claim("a")
    status, eligible, attempts, now = sh.call("fail", "a", 1, "L1", "bad account", "1", 0)
    assert (status, eligible, attempts) == ("dead", 0, 1)
    assert sh.record("a")["error"] == "bad account"
    assert sh.zset(sh.dead_key) == {"a": float(now)}
    assert sh.counts() == {"dead": 1, "claims": 1, "failures": 1}


def test_fail_by_a_non_holder_is_lease_lost(sh: Shard) -> None:
    sh.add("a")
    sh.claim("a")
    before = sh.snapshot()
    assert sh.error("fail", "a", 1, "L9", "x", "1", 0)[0] == "LEASE_LOST"
    assert sh.error("fail", "a", 5, "", "x", "1", 0)[0] == "LEASE_LOST"
    assert unrefused(sh.snapshot()) == unrefused(before)


# -- release ----------------------------------------------------------------------


def test_release_gives_the_item_back_due_now_without_counting_the_attempt(sh: Shard) -> None:
    sh.add("a")
    sh.claim("a")
    [now] = sh.call("release", "a", 1, "L1")
    rec = sh.record("a")
    assert (rec["state"], rec["attempts"], rec["token"]) == ("pending", 0, 1)
    assert "expires_at" not in rec
    assert sh.zset(sh.due_key) == {"a": float(now)}
    assert sh.zset(sh.leases_key) == {} and sh.zset(sh.held_key) == {}
    assert sh.counts() == {"pending": 1, "claims": 1, "releases": 1}
    again = sh.claim("a", lease_id="L2")
    assert (again[1], again[4]) == (2, 1), "the token goes on; the attempt starts again"
    before = sh.snapshot()
    assert sh.error("release", "a", 1, "L1")[0] == "LEASE_LOST"
    assert unrefused(sh.snapshot()) == unrefused(before)


# -- reap -------------------------------------------------------------------------


def test_reap_moves_expired_leases_to_pending_or_dead(sh: Shard) -> None:
    sh.add("short", "long", max_attempts=2)
    sh.claim("short", ttl=30)
    sh.claim("long", ttl=60000)
    sh.expire("short")
    to_pending, to_dead, now = sh.call("reap", 10)
    assert (to_pending, to_dead) == (1, 0)
    rec = sh.record("short")
    assert (rec["state"], rec["attempts"], rec["token"]) == ("pending", 1, 1)
    assert "expires_at" not in rec
    assert sh.zset(sh.due_key) == {"short": float(now)}
    assert set(sh.zset(sh.leases_key)) == {"long"} and set(sh.zset(sh.held_key)) == {"long"}
    assert sh.record("long")["state"] == "leased"

    sh.claim("short", ttl=30)  # the second and last attempt
    sh.expire("short")
    to_pending, to_dead, now = sh.call("reap", 10)
    assert (to_pending, to_dead) == (0, 1)
    rec = sh.record("short")
    assert (rec["state"], rec["error"]) == ("dead", "lease expired on the last attempt")
    assert "expires_at" not in rec
    assert sh.zset(sh.dead_key) == {"short": float(now)}
    assert sh.counts() == {"leased": 1, "dead": 1, "claims": 3, "expired": 2}
    assert sh.call("reap", 10)[:2] == [0, 0]


def test_reap_respects_its_limit(sh: Shard) -> None:
    sh.add("a", "b", "c")
    for item in ("a", "b", "c"):
        sh.claim(item, ttl=30)
    for item in ("a", "b", "c"):
        sh.expire(item)
    assert sh.call("reap", 2)[:2] == [2, 0]
    assert len(sh.zset(sh.leases_key)) == 1
    assert sh.call("reap", 2)[:2] == [1, 0]
    assert sh.counts() == {"pending": 3, "claims": 3, "expired": 3}


# -- requeue ----------------------------------------------------------------------


def _kill_in_order(sh: Shard, *ids: str) -> None:
    """Sends items dead one after another, each at a later server millisecond."""
    for item in ids:
        sh.claim(item, lease_id=f"L-{item}")
        now = sh.call("fail", item, 1, f"L-{item}", "gone", "1", 0)[3]
        wait_past(sh.client, now)


def test_requeue_oldest_dead_items_resets_attempts(sh: Shard) -> None:
    sh.add("a", "b", "c")
    _kill_in_order(sh, "c", "a", "b")
    assert sh.call("requeue", 2) == 2
    assert set(sh.zset(sh.dead_key)) == {"b"}, "the two oldest deaths go first"
    due = sh.zset(sh.due_key)
    assert set(due) == {"c", "a"}
    for item in ("c", "a"):
        rec = sh.record(item)
        assert (rec["state"], rec["attempts"], rec["token"]) == ("pending", 0, 1)
        assert due[item] <= server_ms(sh.client)
    assert sh.counts() == {"pending": 2, "dead": 1, "claims": 3, "failures": 3, "requeued": 2}
    row = sh.claim("c", lease_id="L2")
    assert (row[1], row[4]) == (2, 1), "the token goes on, the attempts start again"


def test_requeue_named_items_leaves_others_alone(sh: Shard) -> None:
    sh.add("a", "b", "p")
    _kill_in_order(sh, "a", "b")
    before = sh.record("p")
    assert sh.call("requeue", 100, "b", "p", "nope") == 1
    assert sh.record("b")["state"] == "pending" and sh.record("a")["state"] == "dead"
    assert sh.record("p") == before
    assert "nope" not in records(sh.client, sh.items_key)
    assert sh.counts()["requeued"] == 1
    assert sh.call("requeue", 100, "b") == 0


# -- bad arguments ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("claim", ["old", "w", "L9", "abc"]),
        ("claim", ["old", "w", "L9", 0]),
        ("claim_next", ["w", "B", "abc", 5]),
        ("claim_next", ["w", "B", 1000, 0]),
        ("renew", ["b", 1, "L1", "abc"]),
        ("renew", ["b", "abc", "L1", 1000]),
        ("commit", ["b", "abc", "L1", "null", "[]", "[]"]),
        ("fail", ["b", "abc", "L1", "boom", "0", 0]),
        ("fail", ["b", 1, "L1", "boom", "0", "abc"]),
        ("fail", ["b", 1, "L1", "boom", "0", 1.5]),
        ("renew", ["b", 0, "L1", 1000]),
        ("renew", ["b", 1, "L1 ", 1000]),
        ("release", ["b", "abc", "L1"]),
    ],
    ids=str,
)
def test_bad_numbers_are_invalid_before_any_write(sh: Shard, name: str, args: list[Any]) -> None:
    sh.add("old", "b")
    sh.claim("old", ttl=20)
    sh.claim("b", ttl=60000)
    sh.expire("old")  # so that a claim would be a takeover, which counts
    before = sh.snapshot()
    assert sh.error(name, *args)[0] == "INVALID"
    assert sh.snapshot() == before


# -- close_shard, shard_status, create_run ----------------------------------------------


def test_close_shard_sets_and_clears_the_flag(sh: Shard) -> None:
    sh.add("a")
    assert sh.call("close_shard", "1") == 1
    assert sh.call("close_shard", "1") == 0
    assert sh.meta()["closed"] == "1"
    assert sh.error("claim", "a", "w", "L", 1000)[0] == "RUN_CLOSED"
    assert sh.call("close_shard", "0") == 1
    assert sh.call("close_shard", "0") == 0
    assert sh.meta()["closed"] == "0"
    assert sh.claim("a")[0] == "a"


def test_shard_status_of_an_empty_shard(sh: Shard) -> None:
    counts, first_due, first_held, now, meta, first_unknown = sh.call("shard_status")
    assert (first_due, first_held, meta, first_unknown) == ("", "", [], "")
    assert dict(zip(counts[::2], counts[1::2], strict=True)) == {
        "pending": 0,
        "leased": 0,
        "dead": 0,
    }
    assert abs(now - server_ms(sh.client)) < 5000
    assert sh.snapshot() == {}


def test_shard_status_reports_counts_first_due_and_oldest_lease(sh: Shard) -> None:
    sh.add("a", "b", "c")
    added_at = int(sh.zset(sh.due_key)["a"])
    wait_past(sh.client, added_at)
    leased_at = sh.claim("b")[7]
    sh.claim("c", lease_id="L2")
    before = sh.snapshot()
    counts, first_due, first_held, now, meta, first_unknown = sh.call("shard_status")
    assert sh.snapshot() == before, "status only reads"
    assert first_unknown == ""
    pairs = dict(zip(counts[::2], map(int, counts[1::2]), strict=True))
    assert pairs == {"pending": 1, "leased": 2, "dead": 0, "claims": 2, "added": 3}
    assert int(float(first_due)) == added_at
    assert int(float(first_held)) == leased_at
    assert now >= leased_at
    assert dict(zip(meta[::2], meta[1::2], strict=True)) == sh.meta()


def test_create_run_is_idempotent(store: LeaseStore) -> None:
    key = store.keys.run(RUN)
    created, shards, created_at = text(store.scripts.run("create_run", [key], [RUN, 4]))
    assert (created, shards) == (1, 4)
    stored = dump_key(store.client, key)
    expected = {"run_id": RUN, "shards": "4", "created_at": str(created_at), "state": "running"}
    assert stored[0] == "hash" and expected.items() <= stored[1].items()
    assert abs(created_at - server_ms(store.client)) < 5000
    again = text(store.scripts.run("create_run", [key], [RUN, 8]))
    assert again == [0, 4, created_at]
    assert dump_key(store.client, key) == stored
