"""Fuzzing every Lua script with hypothesis: generated KEYS and ARGV, not a fixed list.

Each example starts from a fresh scene (a run with an item in every state: pending, leased,
done, dead, retry-delayed, and a lease that has expired; guarded keys of every type), takes
the script's valid call and spoils it: arguments replaced by values of their documented kind
(each header's ``ARGV`` annotations) pushed past the bounds of ``limits.json`` (numbers as
text in every form, ids around the length limit or with foreign characters, JSON of random
shapes, deep, huge or not UTF-8), generated guard specs (documented ops and nonsense ones),
arguments missing or extra, variadic tails, keys dropped, swapped, repeated or retagged.
For every call:

(a) it succeeds or answers an error its header documents, never a raw Lua or Redis error;
(b) a refused call changes no key (``DUMP`` and ``PTTL``), except the ``stale_*`` counters
    that a LEASE_LOST refusal counts on purpose (each up by one);
(c) the scene's shard, and any shard a call wrote, is consistent afterwards;
(d) what a call accepted the Python client reads back: the reply decodes, and every item
    and effect record parses with the store's own readers.

Every generated key starts with the test's prefix (``<prefix>x:...`` stands for a key outside
the store's key space), so nothing outside it is touched on the shared server.

Budget: 25 examples per script on real Redis and 12 on fakeredis, about 15 s on 2 cores
(all three fuzz modules together about 30 s, within their 60 s); ``FUZZ_EXAMPLES=N`` runs N
examples per test of every fuzz module, for long runs. A failure is kept in hypothesis's
database (``.hypothesis/``) and printed with its draws and a ``@reproduce_failure`` blob.
"""

from __future__ import annotations

import re
from typing import Any

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import event, given

from redis_lease import Item, LeaseStore, limits
from redis_lease.protocol.leases import TEXT_SUFFIXES, ItemRecord, effect_record
from redis_lease.protocol.replies import DECODERS
from redis_lease.protocol.scripts import KEY_COUNTS
from tests.fuzz_values import (
    NAMES,
    Kind,
    argv_kinds,
    fuzz_settings,
    garbage,
    guard_json,
    valid_ids,
    value_for,
)
from tests.helpers import stable_dump, wait_past
from tests.test_hostile_protocol import RUN, Scene, call, check_consistent
from tests.test_registry import documented_errors, header

# -- the scene ------------------------------------------------------------------------------


class FuzzScene(Scene):
    """The hostile scene, plus a retry-delayed item, an expired lease and guarded keys.

    Guarded keys: one of each type under the shard's tag, and candidates that a commit
    must refuse (the shard's own keys, other tags, untagged keys under the prefix).
    """

    def __init__(self, store: LeaseStore) -> None:
        super().__init__(store)
        store.add(RUN, [Item("e", {"n": "e"}), Item("f", [1, "f"])])
        retry = store.claim(RUN, "e", "w1")
        store.fail(retry, "try later")  # pending again, due after its backoff (>= 0.5 s)
        self.expired = store.claim(RUN, "f", "w1", ttl=0.001)
        wait_past(self.client, self.expired.expires_at_ms)
        p, tag = store.prefix, f"{store.prefix}:{{{RUN}#0}}"
        self.typed = [f"{tag}:{kind}" for kind in ("hash", "set", "zset", "string", "list")]
        self.client.hset(self.typed[0], mapping={"f": "v", "n": "1"})
        self.client.sadd(self.typed[1], "m")
        self.client.zadd(self.typed[2], {"m": 1})
        self.client.set(self.typed[3], "s")
        self.client.rpush(self.typed[4], "l")
        #: Keys a commit may guard; then every key a commit must refuse to guard.
        self.usable = [self.guard, *self.typed, f"{tag}:new", f"{p}x:plain", f"{p}x:{{{RUN}#0}}:k"]
        self.guarded = [
            *self.usable, *self.shard, *self.effects,
            f"{tag}:attempts", f"{p}:{{{RUN}#1}}:app", f"{p}:{{other}}:app", f"{p}:runs",
            f"{p}:plain", f"{p}:{{}}:app", f"{tag[:-1]}", f"{p}x:{{other}}:k",
        ]  # fmt: skip

    def snapshot(self) -> dict[bytes, tuple[Any, int]]:
        """Content (helpers.stable_dump) and PTTL of every key that starts with the prefix
        (``<prefix>x`` keys too)."""
        keys = sorted(self.client.scan_iter(match=f"{self.store.prefix}*", count=1000))
        return {k: (stable_dump(self.client, k), self.client.pttl(k)) for k in keys}

    def counters(self) -> dict[bytes, dict[bytes, bytes]]:
        """The fields of every ``...:counts`` hash under the prefix."""
        keys = self.client.scan_iter(match=f"{self.store.prefix}*:counts", count=1000)
        return {k: self.client.hgetall(k) for k in keys if self.client.type(k) == b"hash"}  # type: ignore[misc]

    def logs(self) -> dict[bytes, list[Any]]:
        """The entries of every ``...:attempts`` stream under the prefix."""
        keys = self.client.scan_iter(match=f"{self.store.prefix}*:attempts", count=1000)
        return {k: self.client.xrange(k) for k in keys if self.client.type(k) == b"stream"}

    def reset(self) -> None:
        """Deletes every key that starts with the prefix."""
        keys = list(self.client.scan_iter(match=f"{self.store.prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            self.client.delete(*keys[start : start + 500])


def any_key(scene: FuzzScene) -> st.SearchStrategy[Any]:
    """A key name: one of the scene's candidates, or generated under the prefix."""
    p = scene.store.prefix
    return st.one_of(
        st.sampled_from(scene.guarded),
        st.text(max_size=12).map(lambda s: f"{p}:{{{RUN}#0}}:{s}"),
        st.text(max_size=12).map(lambda s: f"{p}:{s}"),
        st.binary(max_size=8).map(lambda b: p.encode() + b":" + b),
    )


# -- spoiled calls --------------------------------------------------------------------------


def _kind_at(name: str, position: int) -> Kind | None:
    fixed, first, rest, _ = argv_kinds(name)
    if position in fixed:
        return fixed[position]
    if first and position >= first and rest:
        return rest[(position - first) % len(rest)]
    return None


@st.composite
def tails(draw: st.DrawFn, name: str) -> list[Any]:
    """A variadic tail: a few groups of hostile or valid values, or one group past the bound."""
    _, _, kinds, most = argv_kinds(name)
    if most in ("add_batch", "guard_specs") and draw(st.integers(0, 5)) == 0:
        count = limits.bound(most)[1] + draw(st.integers(0, 1))
        filler = {"id": "t{}", "json": "{{}}", "text": "v{}"}
        return [filler[k[0]].format(n) for n in range(count) for k in kinds]
    groups = draw(st.integers(0, 4))
    values = [
        draw(st.one_of(valid_ids(), value_for(kind)) if kind[0] == "id" else value_for(kind))
        for _ in range(groups)
        for kind in kinds
    ]
    odd: bool = draw(st.booleans())
    if values and odd:
        values.pop()  # an odd count
    return values


@st.composite
def spoiled_keys(draw: st.DrawFn, keys: list[Any], scene: FuzzScene) -> list[Any]:
    """Keys dropped, added, swapped, replaced or moved to another hash tag."""
    move = draw(st.sampled_from(["replace", "drop", "extra", "swap", "retag", "none"]))
    keys = list(keys)
    if move == "replace" and keys:
        keys[draw(st.integers(0, len(keys) - 1))] = draw(any_key(scene))
    elif move == "drop" and keys:
        keys.pop(draw(st.integers(0, len(keys) - 1)))
    elif move == "extra":
        keys.append(draw(st.sampled_from(keys) | any_key(scene)) if keys else draw(any_key(scene)))
    elif move == "swap" and len(keys) > 1:
        i, j = draw(st.integers(0, len(keys) - 1)), draw(st.integers(0, len(keys) - 1))
        keys[i], keys[j] = keys[j], keys[i]
    elif move == "retag" and keys and isinstance(keys[0], str) and "{" in keys[0]:
        tag = "{" + keys[0].split("{", 1)[1].split("}", 1)[0] + "}"
        new = draw(
            st.sampled_from(["{other}", f"{{{RUN}#1}}", "{}", "", f"{{{RUN}#0", "{x}{y}"])
            | st.text(max_size=6).map(lambda s: "{" + s + "}")
        )
        keys = [k.replace(tag, new, 1) if isinstance(k, str) else k for k in keys]
    elif move == "none":
        keys = []
    return keys


@st.composite
def spoiled_call(draw: st.DrawFn, name: str, scene: FuzzScene) -> tuple[list[Any], list[Any]]:
    """The scene's valid call with 0 to 3 spoiling moves (0: the valid call itself)."""
    keys, args = scene.valid_calls()[name]
    keys, args = list(keys), list(args)
    _, first, rest, _ = argv_kinds(name)
    moves = ["arg"] * 4 + ["arity", "keys"] + (["tail"] * 2 if rest else [])
    moves += ["guards"] * 5 if name == "commit" else []
    for _ in range(draw(st.integers(0, 3))):
        move = draw(st.sampled_from(moves))
        if move == "arg" and args:
            index = draw(st.integers(0, len(args) - 1))
            args[index] = draw(value_for(_kind_at(name, index + 1)))
        elif move == "arity":
            shorter: bool = draw(st.booleans())
            if args and shorter:
                args = args[: draw(st.integers(0, len(args) - 1))]
            else:
                args += draw(st.lists(garbage(), min_size=1, max_size=3))
        elif move == "tail":
            args = args[: first - 1] + draw(tails(name))
        elif move == "keys":
            keys = draw(spoiled_keys(keys, scene))
        elif move == "guards" and len(args) >= 6:
            usable = st.lists(st.sampled_from(scene.usable), min_size=1, max_size=3, unique=True)
            guarded = draw(usable | st.lists(any_key(scene), max_size=4))
            keys = keys[:8] + guarded
            args[4] = draw(guard_json(len(guarded), writes=False))
            args[5] = draw(guard_json(len(guarded), writes=True))
    return keys, args


# -- the checks -----------------------------------------------------------------------------


def assert_unchanged(
    code: str,
    before: dict[bytes, tuple[Any, int]],
    after: dict[bytes, tuple[Any, int]],
    counters_before: dict[bytes, dict[bytes, bytes]],
    counters_after: dict[bytes, dict[bytes, bytes]],
    logs_before: dict[bytes, list[Any]],
    logs_after: dict[bytes, list[Any]],
) -> None:
    """A refusal changed no key; a LEASE_LOST one only ``stale_*`` counters, each up by one,
    and its shard's attempt log, by one ``refused`` entry."""
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    if code != "LEASE_LOST":
        assert not changed, f"refused with {code} but changed {sorted(changed)[:5]}"
        return
    logged = changed & logs_after.keys()
    assert len(logged) == 1, f"LEASE_LOST logged in {logged}"
    for key in logged:
        old_entries, new_entries = logs_before.get(key, []), logs_after[key]
        assert new_entries[: len(old_entries)] == old_entries
        added = new_entries[len(old_entries) :]
        assert [fields[b"event"] for _, fields in added] == [b"refused"], added
    changed -= logged
    assert len(changed) <= 1 and changed <= counters_after.keys(), f"LEASE_LOST changed {changed}"
    for key in changed:
        old, new = counters_before.get(key, {}), counters_after[key]
        bumped = {f for f in old.keys() | new.keys() if old.get(f) != new.get(f)}
        assert b"stale_refused" in bumped and len(bumped) <= 2, f"LEASE_LOST counted {bumped}"
        for field in bumped:
            assert field.startswith(b"stale_"), field
            assert int(new[field]) == int(old.get(field, 0)) + 1, (field, old, new)


def assert_readable(client: redis.Redis, shard_keys: list[Any]) -> None:
    """Every item record and effect record of a shard parses with the store's readers."""
    items = shard_keys[2]
    base = items[: -len(":items")]
    fields: dict[bytes, bytes] = client.hgetall(items)  # type: ignore[assignment]
    for item_id, raw in fields.items():
        if b"#" in item_id:
            continue  # an item's payload, result or error text
        texts = [fields.get(item_id + suffix.encode()) for suffix in TEXT_SUFFIXES.values()]
        try:
            ItemRecord.from_record(RUN, item_id.decode(), 0, raw, *texts)
        except ValueError as error:
            raise AssertionError(
                f"record {item_id!r} unreadable ({error}): {raw[:200]!r}"
            ) from None
    effects: dict[bytes, bytes] = client.hgetall(f"{base}:effects")  # type: ignore[assignment]
    for key, effect in effects.items():
        try:
            effect_record(effect)
        except ValueError as error:
            raise AssertionError(f"effect {key!r} unreadable ({error}): {effect[:200]!r}") from None


def _is_shard(name: str, keys: list[Any]) -> bool:
    return (
        KEY_COUNTS[name] >= 7
        and len(keys) >= 7
        and isinstance(keys[2], str)
        and keys[2].endswith(":items")
    )


def check_call(scene: FuzzScene, name: str, keys: list[Any], args: list[Any]) -> str:
    """Makes one raw call and checks (a) to (d); returns 'ok' or the error code."""
    client = scene.client
    before, counters, logs = scene.snapshot(), scene.counters(), scene.logs()
    try:
        reply = call(scene.store, name, keys, args)
    except redis.ResponseError as error:
        message = str(error)
        code = message.split(" ", 1)[0]
        assert code in documented_errors(name), f"{name} answered undocumented: {message[:300]}"
        assert "user_script" not in message and "attempt to" not in message, message[:300]
        after = scene.snapshot()
        assert_unchanged(code, before, after, counters, scene.counters(), logs, scene.logs())
        check_consistent(client, scene.shard)
        return code
    DECODERS[name](reply)
    for shard in [scene.shard] + ([keys[:7]] if _is_shard(name, keys) else []):
        check_consistent(client, shard)
        assert_readable(client, shard)
    return "ok"


def fuzz_script(store: LeaseStore, name: str, data: st.DataObject) -> None:
    """One example: a fresh scene, one spoiled call of ``name``, the checks."""
    scene = FuzzScene(store)
    try:
        keys, args = data.draw(spoiled_call(name, scene), label="keys, args")
        event(check_call(scene, name, keys, args))
    finally:
        scene.reset()


@pytest.mark.parametrize("name", NAMES)
@fuzz_settings(25)
@given(data=st.data())
def test_generated_calls_on_redis(real_store: LeaseStore, name: str, data: st.DataObject) -> None:
    fuzz_script(real_store, name, data)


@pytest.mark.parametrize("name", NAMES)
@fuzz_settings(5)  # the same scripts as on Redis: a sample, for the embedded backend's Lua
@given(data=st.data())
def test_generated_calls_on_fakeredis(
    fake_store: LeaseStore, name: str, data: st.DataObject
) -> None:
    fuzz_script(fake_store, name, data)


def test_the_generators_know_every_documented_argument() -> None:
    """Every script's ARGV kinds come from its header (so the fuzz follows the docs)."""
    for name in NAMES:
        fixed, first, rest, most = argv_kinds(name)
        documented = {int(n) for n in re.findall(r"ARGV\[(\d+)\]", "\n".join(header(name)))}
        assert set(fixed) == documented, name
        assert bool(first) == bool(rest), name
        if rest:
            assert most in limits.table()["bounds"], f"{name}: tail bound {most}"
        for kind, bound, words in [*fixed.values(), *rest]:
            assert kind != "one" or words, f"{name}: a 'one of' without words"
            assert kind not in ("int", "num") or bound, f"{name}: a number without a bound"


#: Scripts whose first key is a record named by its hash tag alone (a run's, the workers').
TAG_RECORDS = sorted(
    n
    for n in NAMES
    if re.search(r"KEYS_TAKEN = \{\{'', ", (limits.lua_dir() / f"{n}.lua").read_text())
)


@pytest.mark.parametrize("name", TAG_RECORDS)
def test_a_record_named_by_its_tag_is_not_taken_from_another_key_of_that_tag(
    real_store: LeaseStore, name: str
) -> None:
    """A shard's items hash shares a run's tag: given in place of the run's record, it is
    refused with INVALID and nothing changes (it once took a failure count into the items)."""
    scene = FuzzScene(real_store)
    try:
        keys, args = scene.valid_calls()[name]
        items = scene.shard[2]
        assert items.endswith(":items")
        spoiled = [items, *list(keys)[1:]]
        before = scene.snapshot()
        with pytest.raises(redis.ResponseError, match=r"^INVALID KEYS\[1\] must"):
            call(scene.store, name, spoiled, list(args))
        assert scene.snapshot() == before
    finally:
        scene.reset()
