"""Idempotency keys are unambiguous: no two (run, item, effect) triples share a key.

Ids may contain ':', so keys joined with ':' collided (run ``r:a`` item ``b``
and run ``r`` item ``a:b``); keys are joined with '|', which no id may contain,
and a long key keeps a readable head and a digest of the whole.
"""

from __future__ import annotations

import hashlib
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redis_lease import InvalidInput, Item, LeaseStore
from redis_lease.fleet.effects.ledger import KEY_MAX_LENGTH, apply_effect, idempotency_key
from redis_lease.limits import ID_MAX_LENGTH
from redis_lease.protocol.leases import Lease

ID_ALPHABET = string.ascii_letters + string.digits + "_-.:@/+="
#: Short ids, and ids long enough that a key needs the digest form.
ids = st.one_of(
    st.text(ID_ALPHABET, min_size=1, max_size=12),
    st.text(ID_ALPHABET, min_size=1, max_size=ID_MAX_LENGTH),
)
effects = st.text(ID_ALPHABET, min_size=1, max_size=12)
triples = st.tuples(ids, ids, effects)


def test_the_keys_that_collided_differ() -> None:
    assert idempotency_key("r:a", "b", "pay") != idempotency_key("r", "a:b", "pay")
    adhoc = idempotency_key("nightly:2026-12-02:retry", "x", "pay")
    nightly = idempotency_key("nightly:2026-12-02", "retry:x", "pay")
    assert adhoc != nightly
    assert nightly == "nightly:2026-12-02|retry:x|pay", "readable"


@settings(max_examples=400, deadline=None)
@given(triples, triples)
def test_distinct_triples_give_distinct_keys(
    first: tuple[str, str, str], second: tuple[str, str, str]
) -> None:
    if first != second:
        assert idempotency_key(*first) != idempotency_key(*second)
    else:
        assert idempotency_key(*first) == idempotency_key(*second)


short = st.text(ID_ALPHABET, min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(short, short, short, effects)
def test_moving_a_colon_between_run_and_item_changes_the_key(
    a: str, b: str, c: str, effect: str
) -> None:
    """``a:b`` + ``c`` and ``a`` + ``b:c`` join to the same text with ':'; not with '|'."""
    assert idempotency_key(f"{a}:{b}", c, effect) != idempotency_key(a, f"{b}:{c}", effect)
    assert idempotency_key(a, b, f"{c}:{effect}") != idempotency_key(a, f"{b}:{c}", effect)


@settings(max_examples=400, deadline=None)
@given(triples)
def test_a_key_is_short_and_readable_or_a_head_and_a_digest(triple: tuple[str, str, str]) -> None:
    key = idempotency_key(*triple)
    full = "|".join(triple)
    assert len(key) <= KEY_MAX_LENGTH
    if len(full) <= KEY_MAX_LENGTH:
        assert key == full and "~" not in key
        assert tuple(key.split("|")) == triple, "a short key names its triple"
    else:
        head, _, digest = key.rpartition("~")
        assert full.startswith(head) and digest == hashlib.sha256(full.encode()).hexdigest()


@pytest.mark.parametrize("bad", ["a|b", "a b", "", "a{b}", "x" * (ID_MAX_LENGTH + 1)])
def test_every_part_must_be_an_id(bad: str) -> None:
    for triple in ((bad, "i", "e"), ("r", bad, "e"), ("r", "i", bad)):
        with pytest.raises(InvalidInput):
            idempotency_key(*triple)


# -- an effect on a ledger --------------------------------------------------------------------

RUN, ITEM, EFFECT = "nightly:2026-12-02", "acct:7", "pay"


class Provider:
    """Counts calls by key; a lookup finds what was applied."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.applied: dict[str, Any] = {}

    def call(self, key: str) -> Any:
        self.calls.append(key)
        self.applied[key] = {"id": f"ref-{len(self.calls)}"}
        return self.applied[key]

    def lookup(self, key: str) -> Any:
        return self.applied.get(key)


def claim(store: LeaseStore) -> Lease:
    store.add(RUN, [Item(ITEM)], shards=2)
    return store.claim(RUN, ITEM, "w", ttl=30)


def test_an_effect_costs_two_round_trips(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The intent is recorded by the call that reads the ledger: no read of its own."""
    lease = claim(store)
    store.client.script_load(store.scripts["record_effect"].script)  # a first call loads it
    sent: list[str] = []
    for command in ("hget", "hmget", "hgetall", "pipeline", "evalsha", "eval"):
        original = getattr(store.client, command)

        def spy(*args: Any, _name: str = command, _original: Any = original, **kw: Any) -> Any:
            sent.append(_name)
            return _original(*args, **kw)

        monkeypatch.setattr(store.client, command, spy)
    apply_effect(store, lease, EFFECT, Provider().call)
    assert sent == ["evalsha", "evalsha"]
