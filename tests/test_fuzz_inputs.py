"""Fuzzing LeaseStore's public methods with hypothesis: generated ids, payloads, ttls, guards.

Each example starts from the protocol fuzz's scene (an item in every state) and makes one
call of ``add``, ``claim``, ``claim_next``, ``commit`` (with a result, conditions, guarded
writes and a label), ``fail``, ``renew`` or ``release`` with generated arguments:
ids valid, too long, with foreign characters or lone surrogates, or not text at all;
payloads and results of random JSON shapes, too deep, too large as stored, not serialisable;
ttls, delays, counts and times at and past their bounds, NaN, infinite, of the wrong type;
leases with another token, lease id, item, run or shard; guard specs built from the
documented conditions and writes, with nonsense ops, keys under other tags and odd data.

Every call returns, or raises one of the documented errors (InvalidInput, LeaseLost,
NotClaimable, NotFound, ConditionFailed, RunClosed): never a bare redis error, TypeError,
ValueError or KeyError. A refused call changes no key (``DUMP``; a LEASE_LOST refusal only
counts itself in ``stale_*``). After every call each shard is consistent and every record
reads back.

Budget: 120 examples on real Redis and 60 on fakeredis, about 6 s on 2 cores (see
tests/fuzz_values.py: ``FUZZ_EXAMPLES=N`` runs N examples per test).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
from hypothesis import event, given

from redis_lease import (
    ConditionFailed,
    FieldEquals,
    InvalidInput,
    Item,
    KeyExists,
    KeyMissing,
    Lease,
    LeaseLost,
    LeaseStore,
    NotClaimable,
    NotFound,
    RunClosed,
    Write,
    limits,
)
from tests.fuzz_values import (
    ID_MAX,
    JSON_MAX,
    JSON_VALUES,
    WRITE_OPS,
    fuzz_settings,
    mostly,
    valid_ids,
)
from tests.test_fuzz_protocol import FuzzScene, assert_readable, assert_unchanged
from tests.test_hostile_protocol import RUN, check_consistent

#: The errors a LeaseStore call may raise for bad input or a refusal (docs/cli.md exit 2-5).
DOCUMENTED = (InvalidInput, LeaseLost, NotClaimable, NotFound, ConditionFailed, RunClosed)
SURROGATES = ["\ud800", "a\udfffb", "\udcff"]
NOT_SERIALISABLE: list[Any] = [b"bytes", {1, 2}, object(), {"a": b"x"}, {(1, 2): 1}, [float("nan")]]


def py_ids(known: list[str]) -> st.SearchStrategy[Any]:
    """Ids: mostly the scene's; else valid, long, foreign characters, surrogates, not text."""
    return mostly(st.sampled_from(known), st.one_of(
        valid_ids(),
        st.integers(ID_MAX - 1, ID_MAX + 1).map(lambda n: "i" * n),
        st.text(max_size=10),
        st.sampled_from(["", " ", "a b", "a{b}", "a#b", "caf\u00e9", *SURROGATES]),
        st.sampled_from([None, 7, b"a", 1.5]),
    ))  # fmt: skip


def _nested(depth: int, as_list: bool) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if as_list else {"a": value}
    return value


def payloads() -> st.SearchStrategy[Any]:
    """JSON-ready values of random shapes; too deep; sized around the bound as stored; and
    values that are not JSON (NaN, bytes, sets, objects, lone surrogates)."""
    per_char = st.sampled_from([("x", 1), ("/", 2), ('"', 2), ("\u00e9", 2), ("\x7f", 6)])
    sized = per_char.flatmap(
        lambda spec: st.integers(JSON_MAX // (spec[1] * 2) - 2, JSON_MAX // spec[1] + 1).map(
            lambda n: spec[0] * n
        )
    )
    return mostly(JSON_VALUES, st.one_of(
        st.floats(),
        st.builds(_nested, st.sampled_from([31, 32, 33, 1000, 5000]), st.booleans()),
        sized,
        st.sampled_from(NOT_SERIALISABLE),
        st.sampled_from(SURROGATES).map(lambda s: {"k": s}),
    ))  # fmt: skip


def seconds() -> st.SearchStrategy[Any]:
    """TTLs and delays in seconds: at and past the bounds, NaN, infinite, not numbers."""
    edges = [0, 0.001, 0.0004, 0.0005, 86400, 86400.001, 604800, 604800.0005, 604800.001, -1]
    return mostly(st.floats(0.001, 3600), st.one_of(
        st.sampled_from(edges),
        st.floats(),
        st.integers(-10, 10**12),
        st.sampled_from(["5", "x", None, True, [1]]),
    ))  # fmt: skip


def counts() -> st.SearchStrategy[Any]:
    """Whole numbers at and past their bounds, and numbers of the wrong type."""
    return mostly(st.integers(1, 4), st.one_of(
        st.integers(-2, 1100),
        st.sampled_from([limits.SHARD_COUNT_MAX + 1, limits.BATCH_MAX + 1, 10**20]),
        st.sampled_from([None, True, 1.5, "2"]),
    ))  # fmt: skip


def times() -> st.SearchStrategy[Any]:
    """Deadlines in ms on the server clock: none, at and past the bounds, wrong types."""
    return mostly(st.none() | st.just(0), st.one_of(
        st.integers(-1, limits.TIME_MAX_MS + 1),
        st.sampled_from([limits.TIME_MAX_MS + 1, True, 1.5, "0"]),
    ))  # fmt: skip


def guard_keys(scene: FuzzScene) -> st.SearchStrategy[Any]:
    """Keys a commit may guard, keys it must refuse, and keys that are not text."""
    p = scene.store.prefix
    return mostly(st.sampled_from(scene.usable), st.one_of(
        st.sampled_from(scene.guarded),
        st.text(max_size=8).map(lambda s: f"{p}:{{{RUN}#0}}:{s}"),
        st.sampled_from(SURROGATES).map(lambda s: f"{p}:{{{RUN}#0}}:{s}"),
    ))  # fmt: skip


def conditions(scene: FuzzScene) -> st.SearchStrategy[list[Any]]:
    """Lists of the documented conditions with generated keys, fields and values."""
    key = guard_keys(scene)
    value = st.one_of(st.text(max_size=5), st.integers(), st.floats(), st.sampled_from(SURROGATES))
    field = st.sampled_from(["f", "n", ""]) | st.text(max_size=5) | st.sampled_from(SURROGATES)
    one = st.one_of(
        st.builds(FieldEquals, key, field, value),
        st.builds(KeyExists, key),
        st.builds(KeyMissing, key),
    )
    return st.lists(one, max_size=3)


def writes(scene: FuzzScene) -> st.SearchStrategy[list[Any]]:
    """Lists of writes: the documented constructors, raw ops (nonsense too) with any data."""
    key = guard_keys(scene)
    word = st.sampled_from(["f", "m", ""]) | st.text(max_size=5)
    scalar = word | st.integers() | st.floats()
    any_data = st.one_of(JSON_VALUES, st.sampled_from(NOT_SERIALISABLE), st.none())
    one = st.one_of(
        st.builds(Write.hset, key, st.dictionaries(word, scalar, max_size=3)),
        st.builds(Write.hdel, key, st.lists(word, max_size=3)),
        st.builds(Write.sadd, key, st.lists(word, max_size=3)),
        st.builds(Write.srem, key, st.lists(word, max_size=3)),
        st.builds(Write.zadd, key, st.dictionaries(word, st.floats() | st.integers(), max_size=3)),
        st.builds(Write.zrem, key, st.lists(word, max_size=3)),
        st.builds(Write.delete, key),
        st.builds(Write, st.sampled_from([*WRITE_OPS, "eval", "set", ""]), key, any_data),
    )
    many = st.integers(limits.GUARD_SPECS_MAX, limits.GUARD_SPECS_MAX + 1).map(
        lambda n: [Write.sadd(scene.guard, [str(i)]) for i in range(n)]
    )
    return st.lists(one, max_size=3) | many


def leases(scene: FuzzScene) -> st.SearchStrategy[Lease]:
    """The live lease, the expired one, leases by token; some with a field replaced."""
    others = [scene.expired, Lease.from_token(RUN, "b", 0, 1), Lease.from_token(RUN, "d", 0, 1)]
    base = mostly(st.just(scene.lease), st.sampled_from(others))
    changes = st.fixed_dictionaries(
        {},
        optional={
            "token": st.integers(-1, 3) | st.sampled_from([2**63, True, 1.0, "1", None]),
            "lease_id": st.just("") | py_ids([scene.lease.lease_id]),
            "item_id": py_ids(list("abcdef")),
            "run_id": py_ids([RUN, "nope"]),
            "shard": st.integers(-1, 2) | st.just(1023),
        },
    )
    return st.builds(
        lambda lease, kw: dataclasses.replace(lease, **kw), base, mostly(st.just({}), changes)
    )


def operations(scene: FuzzScene) -> dict[str, st.SearchStrategy[dict[str, Any]]]:
    """Per LeaseStore method, its generated keyword arguments."""
    run, item, worker = py_ids([RUN, "new-run"]), py_ids(list("abcdefg")), py_ids(["w9"])
    lease = leases(scene)
    error_texts = mostly(
        st.text(min_size=1, max_size=20),
        st.sampled_from(["", " ", "x" * 5000, "\u00e9" * 2001, *SURROGATES, None]),
    )
    return {
        "add": st.fixed_dictionaries(
            {"run_id": run, "items": st.lists(st.builds(Item, item, payloads()), max_size=4)},
            optional={
                "shards": counts(),
                "max_attempts": counts(),
                "backoff_base": seconds(),
                "backoff_cap": seconds(),
                "deadline_ms": times(),
            },
        ),
        "claim": st.fixed_dictionaries(
            {"run_id": run, "item_id": item, "worker": worker}, optional={"ttl": seconds()}
        ),
        "claim_next": st.fixed_dictionaries(
            {"run_id": run, "worker": worker},
            optional={"shard": st.none() | counts(), "limit": counts(), "ttl": seconds()},
        ),
        "commit": st.fixed_dictionaries(
            {"lease": lease},
            optional={
                "result": payloads(),
                "conditions": conditions(scene),
                "writes": writes(scene),
                "label": st.just("") | py_ids(["ok", "released"]),
            },
        ),
        "fail": st.fixed_dictionaries(
            {"lease": lease, "error": error_texts}, optional={"permanent": st.booleans()}
        ),
        "renew": st.fixed_dictionaries({"lease": lease}, optional={"ttl": seconds()}),
        "release": st.fixed_dictionaries({"lease": lease}, optional={"delay": seconds()}),
    }


def shards_under(scene: FuzzScene) -> list[list[str]]:
    """The seven keys of every shard under the prefix (every ``...:items`` hash)."""
    found = scene.client.scan_iter(match=f"{scene.store.prefix}:*:items", count=1000)
    return [[f"{k.decode()[: -len('items')]}{n}" for n in SHARD_NAMES] for k in found]


SHARD_NAMES = ("meta", "counts", "items", "due", "leases", "held", "dead")


def fuzz_call(store: LeaseStore, data: st.DataObject) -> None:
    """One example: a fresh scene, one generated call, the checks."""
    scene = FuzzScene(store)
    try:
        strategies = operations(scene)
        name = data.draw(st.sampled_from(sorted(strategies)), label="method")
        kwargs = data.draw(strategies[name], label="arguments")
        method: Callable[..., Any] = getattr(store, name)
        before, counters, logs = scene.snapshot(), scene.counters(), scene.logs()
        try:
            method(**kwargs)
        except DOCUMENTED as error:
            assert str(error), f"{type(error).__name__} without a message"
            code = "LEASE_LOST" if type(error) is LeaseLost else type(error).__name__
            after = scene.snapshot()
            assert_unchanged(code, before, after, counters, scene.counters(), logs, scene.logs())
            event(f"{name}: {type(error).__name__}")
        else:
            event(f"{name}: ok")
        for shard in shards_under(scene):
            check_consistent(scene.client, shard)
            assert_readable(scene.client, shard)
    finally:
        scene.reset()


@fuzz_settings(120)
@given(data=st.data())
def test_generated_store_calls_on_redis(real_store: LeaseStore, data: st.DataObject) -> None:
    fuzz_call(real_store, data)


@fuzz_settings(60)
@given(data=st.data())
def test_generated_store_calls_on_fakeredis(fake_store: LeaseStore, data: st.DataObject) -> None:
    fuzz_call(fake_store, data)


def test_payload_sizes_straddle_the_stored_bound() -> None:
    """The sized payloads reach both sides of the bound as stored (so the fuzz tests it)."""
    from redis_lease.protocol.validation import stored_size

    for char, per in [("x", 1), ("/", 2), ('"', 2), ("\u00e9", 2), ("\x7f", 6)]:
        small = json.dumps(char * (JSON_MAX // (per * 2) - 2), ensure_ascii=False)
        large = json.dumps(char * (JSON_MAX // per + 1), ensure_ascii=False)
        assert stored_size(small) <= JSON_MAX < stored_size(large), char
