"""Every script called with each of its keys holding a type it does not take.

A command on a key of another type fails with a raw ``WRONGTYPE`` error, maybe after
other writes of the same script (a Lua error does not roll them back). So every script
checks the type of every key it takes before its first write (``check_keys`` in
``lua/include/protocol.lua``): for every script and every key, a key of each other type
must make the call answer ``INVALID KEYS[n] ...`` and change no key (``DUMP`` and
``PTTL`` of every key before and after), as ``tests/test_hostile_protocol.py`` does for
hostile arguments. The type each key must hold is the one its script's header documents
(a shard's keys: ``lua/include/shard_keys.lua``), so the headers cannot drift from the checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import redis

from redis_lease import LeaseStore
from redis_lease.protocol.scripts import KEY_COUNTS, lua_dir
from tests.test_hostile_protocol import Scene, call, check_consistent
from tests.test_registry import header

#: How to make a key of each type Redis has (the value is never read).
MAKERS: dict[str, Callable[[redis.Redis, str], Any]] = {
    "string": lambda client, key: client.set(key, "x"),
    "list": lambda client, key: client.rpush(key, "x"),
    "set": lambda client, key: client.sadd(key, "x"),
    "zset": lambda client, key: client.zadd(key, {"x": 1}),
    "hash": lambda client, key: client.hset(key, "x", "1"),
    "stream": lambda client, key: client.xadd(key, {"x": "1"}),
}
_TYPE = "|".join(MAKERS)
#: A key line of a header: ``KEYS[n] name: type, ...``; a shard's keys are named only, their
#: types are in include/shard_keys.lua's header (``KEYS[n] name     type: ...``).
_OWN_KEY = re.compile(rf"^KEYS\[(\d+)\] [a-z_]+: ({_TYPE})\b")
_SHARD_KEY = re.compile(rf"^--\s+KEYS\[(\d+)\] ([a-z]+) +({_TYPE}):", re.MULTILINE)
_NAMED_KEY = re.compile(r"KEYS\[(\d+)\] ([a-z]+)\b")


def shard_key_types() -> dict[str, str]:
    """Each shard key's type, by name, as include/shard_keys.lua's header documents it."""
    text = (lua_dir() / "include" / "shard_keys.lua").read_text()
    return {name: kind for _, name, kind in _SHARD_KEY.findall(text)}


def documented_types(name: str) -> dict[int, str]:
    """The type each KEYS[n] of a script must hold, as its header says (1-based)."""
    shard = shard_key_types()
    found: dict[int, str] = {}
    for line in header(name):
        own = _OWN_KEY.match(line)
        if own:
            found[int(own.group(1))] = own.group(2)
        elif line.startswith("KEYS[") and "KEYS[" in line[1:]:  # a line of shard keys
            for position, key in _NAMED_KEY.findall(line):
                found[int(position)] = shard[key]
    return found


@pytest.mark.parametrize("name", sorted(KEY_COUNTS))
def test_every_key_of_every_script_has_a_documented_type(name: str) -> None:
    assert sorted(documented_types(name)) == list(range(1, KEY_COUNTS[name] + 1)), name


def typed_call(scene: Scene, name: str) -> tuple[list[str], list[Any], dict[int, str]]:
    """The scene's valid call of ``name`` and the type each of its keys must hold. A commit's
    guarded key must hold what its write needs: the call writes a hash field, with no
    condition (a condition on a key of another type fails as a condition, not a type)."""
    keys, args = scene.valid_calls()[name]
    types = documented_types(name)
    if name == "commit":
        write = json.dumps([{"do": "hset", "key": 1, "fields": {"f": "v"}}])
        args = [*args[:4], "[]", write, *args[6:]]
        types[len(keys)] = "hash"
    return keys, args, types


def swapped(client: redis.Redis, key: str, kind: str) -> Callable[[], None]:
    """Puts a value of ``kind`` at ``key``; returns how to put the key back as it was."""
    saved, ttl = client.dump(key), client.pttl(key)
    client.delete(key)
    MAKERS[kind](client, key)

    def restore() -> None:
        client.delete(key)
        if saved is not None:
            client.restore(key, max(ttl, 0), saved)

    return restore


@pytest.mark.parametrize("name", sorted(KEY_COUNTS))
@pytest.mark.backends("redis", "fakeredis")  # a cluster node runs the same Lua as a lone Redis
def test_a_key_of_another_type_is_refused_and_changes_nothing(store: LeaseStore, name: str) -> None:
    scene = Scene(store)
    keys, args, types = typed_call(scene, name)
    tried = 0
    for position, key in enumerate(keys, start=1):
        for kind in sorted(set(MAKERS) - {types[position]}):
            restore = swapped(store.client, key, kind)
            before = scene.dump()
            with pytest.raises(redis.ResponseError) as refused:
                call(store, name, keys, args)
            message = str(refused.value)
            if position > KEY_COUNTS[name]:  # a commit's guarded key, named by its write
                assert message == f"INVALID write 1 needs a hash but key 1 holds a {kind}"
            else:
                assert message.startswith(f"INVALID KEYS[{position}] "), (name, kind, message)
                assert f"holds a {kind}, not a {types[position]}" in message, message
            assert scene.dump() == before, f"{name}: refused for KEYS[{position}] but changed keys"
            restore()
            tried += 1
    assert tried == len(keys) * (len(MAKERS) - 1)
    # Every key back as it was: the valid call is accepted and leaves the shard consistent.
    call(store, name, keys, args)
    check_consistent(store.client, scene.shard)


def test_a_missing_key_is_not_a_wrong_type(store: LeaseStore) -> None:
    """A key that does not exist yet is fine: every script starts from missing keys."""
    keys = store.keys.logged("fresh", 0)
    assert store.client.exists(*keys) == 0
    assert call(store, "claim_next", keys, ["w", "B", 60000, 5]) == []
    assert call(store, "reap", keys, [10])[:2] == [0, 0]
    assert store.client.exists(*keys) == 0
