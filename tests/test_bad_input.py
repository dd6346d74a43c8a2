"""Bad input is refused with InvalidInput and a clear message before anything is written;
an unreachable or unwelcoming Redis is RedisUnavailable."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import redis

from redis_lease import InvalidInput, Item, Lease, LeaseStore, RedisUnavailable, Write
from redis_lease.limits import JSON_MAX_BYTES as PAYLOAD_MAX_BYTES
from tests.helpers import keys_under, snapshot
from tests.redis_server import RedisServer, free_port

RUN = "bad:2026-12-02"

BAD_IDS = [
    "{",
    "}",
    "a{b}c",
    "a b",
    " ",
    "a\tb",
    "a\nb",
    "a\x00b",
    "\x07",
    "a\x7fb",
    "",
    "x" * 201,
    "a#b",
    "café",
]
BAD_ID_NAMES = [repr(v) if len(v) < 10 else f"{len(v)}-chars" for v in BAD_IDS]
NOT_STRINGS: list[Any] = [42, None, b"bytes"]
BAD_VALUES: list[Any] = [*BAD_IDS, *NOT_STRINGS]
BAD_VALUE_NAMES = [*BAD_ID_NAMES, "int", "none", "bytes"]


def nothing_under(store: LeaseStore) -> None:
    assert keys_under(store.client, store.prefix) == []


# -- ids ----------------------------------------------------------------------------


@pytest.mark.backends("redis")  # checked in Python before Redis is called
@pytest.mark.parametrize("bad", BAD_VALUES, ids=BAD_VALUE_NAMES)
def test_a_bad_item_id_refuses_the_whole_add(store: LeaseStore, bad: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        store.add(RUN, [Item("good"), Item(bad)])
    assert info.value.message.startswith("invalid item id ")
    if isinstance(bad, str):
        assert "1-200 characters" in info.value.message
        if len(bad) < 10:
            assert repr(bad) in info.value.message
    else:  # not text: what it is, by value and type
        assert f"{bad!r} of type {type(bad).__name__}: an id is a str" in info.value.message
    assert info.value.exit_code == 2
    nothing_under(store)


@pytest.mark.backends("redis")  # checked in Python before Redis is called
@pytest.mark.parametrize("bad", BAD_VALUES, ids=BAD_VALUE_NAMES)
def test_a_bad_run_id_is_refused_everywhere(store: LeaseStore, bad: Any) -> None:
    for call in (
        lambda: store.add(bad, [Item("a")]),
        lambda: store.create_run(bad, 2),
        lambda: store.claim(bad, "a", "w"),
        lambda: store.claim_next(bad, "w"),
        lambda: store.status(bad),
        lambda: store.reap(bad),
        lambda: store.commit(Lease.from_token(bad, "a", 0, 1)),
    ):
        with pytest.raises(InvalidInput, match=r"^invalid run id "):
            call()
    nothing_under(store)


@pytest.mark.backends("redis")  # checked in Python before Redis is called
@pytest.mark.parametrize("bad", BAD_IDS, ids=BAD_ID_NAMES)
def test_a_bad_worker_or_item_id_changes_nothing_in_an_existing_run(
    store: LeaseStore, bad: str
) -> None:
    store.add(RUN, [Item("a")], shards=2)
    lease = store.claim(RUN, "a", "w")
    before = snapshot(store.client, store.prefix)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("worker", lambda: store.claim(RUN, "a", bad)),
        ("worker", lambda: store.claim_next(RUN, bad)),
        ("item id", lambda: store.claim(RUN, bad, "w")),
        ("item id", lambda: store.item(RUN, bad)),
        ("item id", lambda: store.requeue(RUN, ["a", bad])),
        ("item id", lambda: store.lease_ref(RUN, bad, 1)),
        ("item id", lambda: store.commit(replace(lease, item_id=bad))),
        ("item id", lambda: store.add(RUN, [Item(bad)])),
    ]
    for what, call in calls:
        with pytest.raises(InvalidInput, match=f"^invalid {what} "):
            call()
    assert snapshot(store.client, store.prefix) == before


@pytest.mark.backends("redis")  # checked in Python before Redis is called
@pytest.mark.parametrize("bad", ["2", 1.0, True, None, [0]])
def test_a_shard_of_the_wrong_type_is_refused_with_invalid_input(
    store: LeaseStore, bad: Any
) -> None:
    """Not a raw ``TypeError`` from comparing it (``None`` is "any shard", so it is taken)."""
    store.add(RUN, [Item("a")], shards=4)
    before = snapshot(store.client, store.prefix)
    if bad is None:
        assert [lease.item_id for lease in store.claim_next(RUN, "w", shard=bad)] == ["a"]
        return
    with pytest.raises(InvalidInput, match=r"^invalid shard .* of type \w+: a shard is an int"):
        store.claim_next(RUN, "w", shard=bad)
    assert snapshot(store.client, store.prefix) == before


def test_the_longest_id_and_every_allowed_character_are_accepted(store: LeaseStore) -> None:
    longest = "x" * 200
    every = "AZaz09_-.:@/+="
    assert store.add(RUN, [Item(longest), Item(every)]) == ([longest, every], [])
    assert store.claim(RUN, every, worker=longest).item_id == every


def test_a_bad_prefix_is_refused(store: LeaseStore) -> None:
    with pytest.raises(InvalidInput, match="invalid prefix"):
        LeaseStore(store.client, prefix="a{b}")


# -- payloads and results -----------------------------------------------------------------


def test_the_payload_limit_is_in_encoded_bytes(store: LeaseStore) -> None:
    fits = "x" * (PAYLOAD_MAX_BYTES - 4)  # two quotes, each escaped inside the record
    assert store.add(RUN, [Item("fits", fits)]) == (["fits"], [])
    before = snapshot(store.client, store.prefix)
    for too_big in ("x" * (PAYLOAD_MAX_BYTES - 3), "é" * (PAYLOAD_MAX_BYTES // 2), [0] * 40_000):
        with pytest.raises(InvalidInput, match=f"over the {PAYLOAD_MAX_BYTES}-byte limit"):
            store.add(RUN, [Item("ok"), Item("big", too_big)])
    assert snapshot(store.client, store.prefix) == before
    assert store.item(RUN, "fits").payload == fits


NOT_JSON = [
    object(),
    {1, 2},
    b"bytes",
    float("nan"),
    float("inf"),
    {"when": dt.date(2026, 12, 2)},
    {"nested": [1, {"deep": object()}]},
    {("tuple", "key"): 1},
]
NOT_JSON_IDS = ["object", "set", "bytes", "nan", "inf", "date", "nested", "tuple-key"]


@pytest.mark.backends("redis")  # checked in Python before Redis is called
@pytest.mark.parametrize("payload", NOT_JSON, ids=NOT_JSON_IDS)
def test_a_payload_that_is_not_json_refuses_the_whole_add(store: LeaseStore, payload: Any) -> None:
    with pytest.raises(InvalidInput, match=r"^payload is not JSON-serialisable"):
        store.add(RUN, [Item("good", {"n": 1}), Item("bad", payload)])
    nothing_under(store)


@pytest.mark.backends("redis")  # checked in Python before Redis is called
@pytest.mark.parametrize("result", [*NOT_JSON, "x" * PAYLOAD_MAX_BYTES], ids=[*NOT_JSON_IDS, "big"])
def test_a_bad_result_leaves_the_lease_uncommitted(store: LeaseStore, result: Any) -> None:
    store.add(RUN, [Item("a")])
    lease = store.claim(RUN, "a", "w")
    before = snapshot(store.client, store.prefix)
    with pytest.raises(InvalidInput, match=r"^result "):
        store.commit(lease, result)
    assert snapshot(store.client, store.prefix) == before
    assert store.commit(lease, "fine").result == "fine"


def test_a_bad_guarded_write_is_invalid_and_writes_nothing(store: LeaseStore) -> None:
    store.add(RUN, [Item("a")])
    lease = store.claim(RUN, "a", "w")
    key = f"{store.prefix}:{{{RUN}#0}}:seat"
    store.client.hset(key, "v", "1")
    before = snapshot(store.client, store.prefix)
    for writes in (
        [Write.hset(key, {"v": "2"}), Write("incr", key)],
        [Write.hset(key, {"v": "2"}), Write.sadd(key, ["m"])],
        [Write.hset(key, {"v": "2"}), Write.zadd(key, {})],
    ):
        with pytest.raises(InvalidInput, match=r"^invalid request: write 2 "):
            store.commit(lease, "x", writes=writes)
    assert snapshot(store.client, store.prefix) == before


def test_a_missing_error_text_is_refused(store: LeaseStore) -> None:
    store.add(RUN, [Item("a")])
    lease = store.claim(RUN, "a", "w")
    before = snapshot(store.client, store.prefix)
    for text in ("", "   ", None):
        with pytest.raises(InvalidInput, match="error text is required"):
            store.fail(lease, text)  # type: ignore[arg-type]
    assert snapshot(store.client, store.prefix) == before


# -- TTLs and numbers -----------------------------------------------------------------


BAD_TTLS = [0, -1, -0.5, 0.0004, 7 * 24 * 3600 + 1, float("nan"), float("inf"), "soon", None]


@pytest.mark.backends("redis")  # checked in Python before Redis is called
@pytest.mark.parametrize("ttl", BAD_TTLS, ids=str)
def test_a_bad_ttl_is_refused_and_changes_nothing(store: LeaseStore, ttl: Any) -> None:
    store.add(RUN, [Item("a"), Item("b")])
    lease = store.claim(RUN, "b", "w")
    before = snapshot(store.client, store.prefix)
    for call in (
        lambda: store.claim(RUN, "a", "w", ttl=ttl),
        lambda: store.claim_next(RUN, "w", ttl=ttl),
        lambda: store.renew(lease, ttl=ttl),
    ):
        with pytest.raises(InvalidInput, match=r"^ttl "):
            call()
    assert snapshot(store.client, store.prefix) == before


@pytest.mark.backends("redis")  # checked in Python before Redis is called
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"backoff_base": -1}, "^backoff_base "),
        ({"backoff_cap": float("inf")}, "^backoff_cap "),
        ({"max_attempts": 0}, "^max_attempts must be"),
        ({"max_attempts": 1001}, "^max_attempts must be"),
        ({"max_attempts": 2.5}, "^max_attempts must be"),
        ({"max_attempts": True}, "^max_attempts must be"),
        ({"shards": 0}, "^shards must be"),
        ({"shards": -3}, "^shards must be"),
        ({"shards": 1025}, "^shards must be"),
        ({"shards": "4"}, "^shards must be"),
    ],
    ids=str,
)
def test_bad_add_options_write_nothing(
    store: LeaseStore, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        store.add(RUN, [Item("a")], **options)
    nothing_under(store)


def test_no_items_is_refused(store: LeaseStore) -> None:
    with pytest.raises(InvalidInput, match="no items"):
        store.add(RUN, [])
    nothing_under(store)


def test_bad_limits_are_refused(store: LeaseStore) -> None:
    store.add(RUN, [Item("a")])
    before = snapshot(store.client, store.prefix)
    for call in (
        lambda: store.claim_next(RUN, "w", limit=0),
        lambda: store.claim_next(RUN, "w", limit=-1),
        lambda: store.claim_next(RUN, "w", limit=10_001),
        lambda: store.reap(RUN, limit=0),
        lambda: store.requeue(RUN, limit=0),
    ):
        with pytest.raises(InvalidInput, match=r"^limit must be"):
            call()
    assert snapshot(store.client, store.prefix) == before


def test_a_shard_count_mismatch_is_refused_and_writes_nothing(store: LeaseStore) -> None:
    assert store.create_run(RUN, 4) == (True, 4)
    before = snapshot(store.client, store.prefix)
    with pytest.raises(InvalidInput, match="has 4 shards, not 8") as info:
        store.add(RUN, [Item("a")], shards=8)
    assert info.value.run_id == RUN
    with pytest.raises(InvalidInput, match="has 4 shards, not 2"):
        store.create_run(RUN, 2)
    fresh = LeaseStore(store.client, prefix=store.prefix)  # no cached count
    with pytest.raises(InvalidInput, match="has 4 shards, not 1"):
        fresh.add(RUN, [Item("a")], shards=1)
    assert snapshot(store.client, store.prefix) == before
    assert store.add(RUN, [Item("a")], shards=4) == (["a"], [])


@pytest.mark.backends("redis")  # checked in Python before Redis is called
@pytest.mark.parametrize("token", [0, -1, -(2**63), "1", 1.5, None], ids=str)
def test_a_bad_token_is_refused_before_redis_sees_it(store: LeaseStore, token: Any) -> None:
    store.add(RUN, [Item("a")])
    store.claim(RUN, "a", "w")
    bad = Lease.from_token(RUN, "a", store.shard_for(RUN, "a"), token)
    before = snapshot(store.client, store.prefix)
    for call in (
        lambda: store.commit(bad, "x"),
        lambda: store.renew(bad),
        lambda: store.fail(bad, "x"),
        lambda: store.release(bad),
    ):
        with pytest.raises(InvalidInput, match=r"^token must be a whole number from 1"):
            call()
    assert snapshot(store.client, store.prefix) == before, "not even counted as stale"


# -- Redis that cannot be used -------------------------------------------------------------


def test_an_unreachable_redis_is_redis_unavailable(prefix: str) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with pytest.raises(RedisUnavailable, match="is unreachable") as info:
        LeaseStore.from_url(url, prefix=prefix)
    assert info.value.exit_code == 6
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    store = LeaseStore(client, prefix=prefix, url=url)
    for call in (
        lambda: store.add(RUN, [Item("a")]),
        lambda: store.create_run(RUN, 2),
        lambda: store.run_ids(),
        lambda: store.claim(RUN, "a", "w"),
    ):
        with pytest.raises(RedisUnavailable, match=f"127.0.0.1:{port}/0 is unreachable"):
            call()
    client.close()


def test_a_wrong_password_is_redis_unavailable(
    private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    server = private_redis(requirepass="s3cret")
    for url in (
        f"redis://:wrong-secret@127.0.0.1:{server.port}/0",
        f"redis://127.0.0.1:{server.port}/0",
    ):
        with pytest.raises(RedisUnavailable) as info:
            store = LeaseStore.from_url(url, prefix=prefix)
            store.create_run(RUN)
        assert "wrong-secret" not in info.value.message, "the password is never shown"
        assert "check" in info.value.message
    good = LeaseStore.from_url(server.url, prefix=prefix)
    assert good.create_run(RUN) == (True, 1)
    good.client.close()


def test_an_unknown_url_scheme_is_invalid_input(prefix: str) -> None:
    with pytest.raises(InvalidInput, match="unsupported Redis URL"):
        LeaseStore.from_url("http://127.0.0.1:6379", prefix=prefix)
