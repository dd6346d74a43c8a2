"""The protocol at its edges: the deadline bar, lost items, guarded keys, record size, NOSCRIPT.

Runs on real Redis and on fakeredis (the ``store`` fixture).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from redis.client import Pipeline
from typer.testing import CliRunner

from redis_lease import FieldEquals, InvalidInput, Item, LeaseStore, RunClosed, Write
from redis_lease.cli import app
from redis_lease.limits import JSON_MAX_DEPTH, bound
from redis_lease.protocol.scripts import Call
from redis_lease.protocol.validation import parse_json, stored_size
from tests.helpers import records, server_ms, text, wait_past


def _counter(store: LeaseStore, run_id: str, name: str) -> int:
    return store.status(run_id).counters.get(name, 0)


def test_no_lease_is_granted_after_the_deadline_on_the_server_clock(store: LeaseStore) -> None:
    deadline = server_ms(store.client) + 300
    store.add("r", [Item("a"), Item("b"), Item("c")], shards=1, deadline_ms=deadline)
    early = store.claim("r", "a", "w", ttl=60)
    wait_past(store.client, deadline)
    with pytest.raises(RunClosed, match="deadline") as info:
        store.claim("r", "b", "w")
    assert info.value.run_id == "r"
    with pytest.raises(RunClosed):
        store.claim_next("r", "w", limit=5)
    assert store.item("r", "b").state == "pending", "the refused claim wrote nothing"
    # A lease granted before the deadline may still commit; the commit is counted as late.
    assert store.commit(early, {"ok": 1}).repeated is False
    assert _counter(store, "r", "late_commits") == 1
    assert records(store.client, store.keys.shard("r", 0)[2])["a"]["late"] is True


def test_set_deadline_moves_the_bar_and_zero_lifts_it(store: LeaseStore) -> None:
    store.add("r", [Item("a"), Item("b")], shards=1, deadline_ms=server_ms(store.client) - 1)
    with pytest.raises(RunClosed):
        store.claim("r", "a", "w")
    store.set_deadline("r", 0)
    lease = store.claim("r", "a", "w")
    store.commit(lease)
    assert _counter(store, "r", "late_commits") == 0, "no deadline: no commit is late"
    store.set_deadline("r", server_ms(store.client) + 60_000)
    assert store.claim("r", "b", "w").item_id == "b"


def test_an_item_whose_record_vanished_is_counted_lost(store: LeaseStore) -> None:
    store.add("r", [Item(f"i{n}") for n in range(6)], shards=1)
    items_key = store.keys.shard("r", 0)[2]
    store.client.hdel(items_key, "i0", "i1")  # what eviction or a lost write leaves
    leases = store.claim_next("r", "w", limit=10)
    assert sorted(lease.item_id for lease in leases) == ["i2", "i3", "i4", "i5"]
    status = store.status("r")
    assert status.counters["lost"] == 2
    assert status.counters["added"] == 6
    assert status.counts["leased"] == 4 and status.counts["pending"] == 0


def _own_and_foreign_keys(store: LeaseStore, shard: int) -> list[str]:
    tag = f"{store.prefix}:{{r#{shard}}}"
    return [
        *store.keys.shard("r", shard),
        *store.keys.effects("r", shard),
        f"{store.prefix}:{{r#{shard + 1}}}:app",  # another shard's data
        store.keys.run("r"),
        store.keys.runs,
        f"{tag}:attempts",
    ]


def test_guarded_writes_may_not_touch_the_stores_own_or_another_shards_keys(
    store: LeaseStore,
) -> None:
    store.add("r", [Item("a")], shards=1)
    lease = store.claim("r", "a", "w")
    for key in _own_and_foreign_keys(store, lease.shard):
        before = records(store.client, store.keys.shard("r", 0)[2])
        # A cluster refuses a key of another slot before the script sees it.
        refusal = "guarded key 1|CROSSSLOT" if store.on_cluster else "guarded key 1"
        with pytest.raises(InvalidInput, match=refusal):
            store.commit(lease, writes=[Write.delete(key)])
        assert records(store.client, store.keys.shard("r", 0)[2]) == before, key
    mine = f"{store.prefix}:{{r#{lease.shard}}}:app"
    store.client.hset(mine, "v", "1")
    store.commit(lease, conditions=[FieldEquals(mine, "v", 1)], writes=[Write.delete(mine)])
    assert store.client.exists(mine) == 0


@pytest.mark.parametrize(
    "writes",
    [
        '{"1": {"do": "del", "key": 1}}',  # an object, not an array: was skipped before
        '[{"do": "hset", "key": 1, "fields": {"f": {"nested": 1}}}]',
        '[{"do": "hset", "key": 1, "fields": {"f": null}}]',
        '[{"do": "sadd", "key": 1, "members": [["x"]]}]',
    ],
)
def test_guard_specs_of_undocumented_shapes_are_refused(store: LeaseStore, writes: str) -> None:
    store.add("r", [Item("a")], shards=1)
    lease = store.claim("r", "a", "w")
    mine = f"{store.prefix}:{{r#0}}:app"
    store.client.hset(mine, "v", "1")
    keys = [*store.keys.logged("r", 0), mine]
    with pytest.raises(redis.ResponseError, match=r"^INVALID (write|guarded)"):
        store.scripts.run("commit", keys, ["a", lease.token, lease.lease_id, "null", "[]", writes])
    assert text(store.client.hget(mine, "v")) == "1"
    assert store.item("r", "a").state == "leased"


@pytest.mark.parametrize("char", ['"', "\x7f", "/"], ids=["quote", "del", "slash"])
def test_json_is_bounded_as_stored_so_the_record_is_bounded(store: LeaseStore, char: str) -> None:
    """A payload counts as it sits, escaped, in the record (a DEL byte becomes six bytes)."""
    most = bound("json_bytes")[1]
    keys = store.keys.shard("r", 0)
    per_char = len(json.dumps(char, ensure_ascii=False).encode()) - 2
    count = (most - 2) // per_char  # as many as fit, raw
    fits = json.dumps(char * (count // 8), ensure_ascii=False)
    too_big = json.dumps(char * count, ensure_ascii=False)
    assert len(too_big.encode()) <= most, "raw, it is within the bound"
    assert stored_size(fits) <= most < stored_size(too_big)
    with pytest.raises(redis.ResponseError, match=r"^INVALID ARGV\[8\] is \d+ bytes as stored"):
        store.scripts.run("add_items", keys, ["r", 0, 3, 1000, 60000, 0, "b", too_big])
    with pytest.raises(InvalidInput, match="as stored"):
        store.add("r", [Item("b", char * count)])
    assert store.client.hexists(keys[2], "b") == 0, "nothing was written"
    assert store.add("r", [Item("a", char * (count // 8))]) == (["a"], [])
    raw = store.client.hget(keys[2], "a")
    assert raw is not None and len(raw) <= bound("record_bytes")[1]
    lease = store.claim("r", "a", "w")
    store.commit(lease, char * (count // 8))
    assert len(store.client.hget(keys[2], "a") or b"") <= bound("record_bytes")[1]


@pytest.mark.real_redis_only("fakeredis decodes script arguments as text")
def test_text_that_is_not_utf8_is_refused(store: LeaseStore) -> None:
    keys = store.keys.shard("r", 0)
    for bad in (b'"\xff"', b'"\xc0\x80"', b'"\xed\xa0\x80"'):
        with pytest.raises(redis.ResponseError, match="must be UTF-8"):
            store.scripts.run("add_items", keys, ["r", 0, 3, 1000, 60000, 0, "a", bad])
    assert store.client.exists(keys[2]) == 0
    store.scripts.run("add_items", keys, ["r", 0, 3, 1000, 60000, 0, "a", '"\u00e9 é ü 𝄞"'])
    assert json.loads(records(store.client, keys[2])["a"]["payload"]) == "é é ü 𝄞"


@pytest.mark.real_redis_only("SCRIPT FLUSH between a pipeline's script load and its run")
def test_noscript_inside_a_pipeline_reloads_and_sends_again(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.add("r", [Item("a"), Item("b")], shards=1)
    leases = [store.claim("r", i, "w") for i in ("a", "b")]
    store.client.script_flush()
    original = store.client.script_load
    flushes: list[int] = []

    def load_then_flush(script: Any) -> Any:
        sha = original(script)
        if not flushes:  # the scripts vanish between the reload and the resend, once
            flushes.append(1)
            store.client.script_flush()
        return sha

    def no_script_exists(self: Any) -> None:
        raise AssertionError("a pipeline of scripts sent SCRIPT EXISTS")

    monkeypatch.setattr(Pipeline, "load_scripts", no_script_exists)
    monkeypatch.setattr(store.client, "script_load", load_then_flush)
    renewed = store.renew_many(leases, ttl=120)
    assert flushes and all(lease is not None for lease in renewed)
    keys = store.keys.status("r", 0)
    store.client.script_flush()
    flushes.clear()
    [status] = store.scripts.many([Call("shard_status", keys, [])])
    assert status.counts["leased"] == 2


@pytest.mark.parametrize("depth", [JSON_MAX_DEPTH + 1, 5000])
def test_json_nested_past_the_documented_depth_is_invalid_input(
    store: LeaseStore, depth: int
) -> None:
    nested = "[" * depth + "]" * depth
    with pytest.raises(InvalidInput, match=f"more than {JSON_MAX_DEPTH} levels"):
        parse_json(nested)
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    with pytest.raises(InvalidInput, match=f"more than {JSON_MAX_DEPTH} levels"):
        store.add("r", [Item("a", value)])
    assert store.client.exists(store.keys.run("r")) == 0, "nothing was written"
    result = CliRunner().invoke(
        app, ["--url", "fakeredis://depth", "add", "r", "a", "--payload", nested]
    )
    assert result.exit_code == 2 and f"more than {JSON_MAX_DEPTH} levels" in result.output
    ok = "[" * JSON_MAX_DEPTH + "]" * JSON_MAX_DEPTH
    assert parse_json(ok) is not None
