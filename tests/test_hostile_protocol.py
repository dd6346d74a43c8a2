"""Every script called with hostile KEYS and ARGV, as a client in any language could.

Each call must either succeed or answer an error reply that its header
documents (never a raw Lua error), a refused call must change no key (``DUMP``
and ``PTTL`` of every key before and after), and after every call each shard
is consistent: every record sits in exactly the index of its state, with a
finite score, and every index entry has a record.

A refusal for a stale holder (``LEASE_LOST``) is counted on purpose
(``stale_*`` counters, shown by status and metrics) and logged (one ``refused``
entry in the shard's attempt log); those are the only changes such a refusal may make.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from redis_lease import Item, LeaseStore
from redis_lease.protocol.leases import read_items
from redis_lease.protocol.scripts import KEY_COUNTS
from tests.helpers import stable_dump, text
from tests.test_registry import documented_errors

RUN = "hostile"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
#: Values that are not what a numeric, id or JSON argument must be.
HOSTILE = [
    "nan", "-nan", "inf", "-inf", "1e300", "-1e300", "0x10", "1e3", " 5", "5 ", "-1", "1.5",
    "", "abc", "99999999999999999999", "{}", "[]", "null", "a b", "{x}", "\x00", "x" * 300,
    "9" * 15, "0", json.dumps("\x7f" * 20_000, ensure_ascii=False),
]  # fmt: skip
GUARDS = [
    '{"1": {"if": "exists", "key": 1}}',
    '{"if": "exists", "key": 1}',
    '[{"if": "exists", "key": 1.5}]',
    '[{"if": "equals", "key": 1, "field": "f", "value": null}]',
    '[{"if": "equals", "key": 1, "field": "f", "value": {"nested": 1}}]',
    '[{"if": "equals", "key": 1, "field": ["f"], "value": "v"}]',
    "[1, 2, 3]",
    "[[]]",
    "[" * 200 + "]" * 200,
]
WRITES = [
    '{"do": "del", "key": 1}',
    '[{"do": "eval", "key": 1}]',
    '[{"do": "hset", "key": 1, "fields": {"f": null}}]',
    '[{"do": "hset", "key": 1, "fields": {"f": {"a": 1}}}]',
    '[{"do": "hset", "key": 1, "fields": ["f", "v"]}]',
    '[{"do": "sadd", "key": 1, "members": {"m": 1}}]',
    '[{"do": "sadd", "key": 1, "members": [null]}]',
    '[{"do": "zadd", "key": 1, "scores": {"m": 1e400}}]',
    '[{"do": "zadd", "key": 1, "scores": {"m": "1"}}]',
    '[{"do": "del", "key": 0}]',
    '[{"do": "del", "key": 2}]',
]


class Scene:
    """A shard with one item in each state, a ledger record and a provider gate."""

    def __init__(self, store: LeaseStore) -> None:
        self.store, self.client = store, store.client
        store.add(RUN, [Item(i, {"n": i}) for i in ("a", "b", "c", "d")], shards=1)
        self.lease = store.claim(RUN, "a", "w1")
        done = store.claim(RUN, "d", "w1")
        store.commit(done, {"ok": True})
        dead = store.claim(RUN, "c", "w1")
        store.fail(dead, "boom", permanent=True)
        store.record_effect(self.lease, "k1", "pay", "intended")
        self.shard = store.keys.shard(RUN, 0)
        self.logged = store.keys.logged(RUN, 0)  # with the attempt log
        self.effects = store.keys.effects(RUN, 0)
        self.guard = f"{store.prefix}:{{{RUN}#0}}:app"
        self.provider = store.keys.provider("p")
        self.run = [store.keys.run(RUN), store.keys.run_events(RUN)]
        self.lock = f"{store.prefix}:lock"
        self.client.set(self.lock, "owner")
        job = store.keys.job("nightly")
        self.tallies = [f"{job}:tallies", f"{job}:finished_runs", f"{job}:dates", f"{job}:lost"]

    def valid_calls(self) -> dict[str, tuple[list[str], list[Any]]]:
        """One call per script that succeeds in this scene."""
        lease, keys = self.lease, self.store.keys
        registry = keys.shard_job_registry
        holder = ["a", lease.token, lease.lease_id]
        cond = json.dumps([{"if": "missing", "key": 1}])
        write = json.dumps([{"do": "hset", "key": 1, "fields": {"f": "v"}}])
        return {
            "add_items": (self.shard, [RUN, 0, 3, 1000, 60000, 0, "e", "{}"]),
            "claim": (self.logged, ["b", "w2", "L2", 60000]),
            "claim_next": (self.logged, ["w2", "B2", 60000, 5]),
            "renew": (self.logged, [*holder, 60000, TRACE]),
            "commit": ([*self.logged, self.guard], [*holder, '{"r":1}', cond, write, "ok", TRACE]),
            "settle": (
                self.logged,
                ["renew", *holder, 60000, "", TRACE, "commit", *holder, "{}", "ok", TRACE],
            ),
            "fail": (self.logged, [*holder, "boom", "0", "0.5", TRACE]),
            "release": (self.logged, [*holder, 1000, TRACE]),
            "reap": (self.logged, [100]),
            "cut_leases": (self.shard, ["w1", 100]),
            "worker_beat": (self.store.keys.workers, ["w1", '{"pid": 1}', 60000]),
            "register_shard_job": (registry, ["rl-1", "register", '{"run_id": "r"}', 2000]),
            "shard_job_beat": (registry[1::2], ["rl-1", 2000]),
            "sweep_shard_jobs": (registry, [5000, 2000, 100, 30000]),
            "take_shard_jobs": (registry, ["take", 5000, 2000, 30000, "rl-1"]),
            "requeue": (self.shard, [100, "c"]),
            "close_shard": (self.shard, ["1", 0]),
            "shard_status": ([*self.shard, self.effects[1]], []),
            "create_run": (self.run[:1], [RUN, 1, "running", "job", "j"]),
            "run_transition": (self.run, ["*", "running", "why", "f", "v"]),
            "release_lock": ([self.lock], ["owner"]),
            "record_effect": (
                [*self.logged, *self.effects],
                [*holder, "k1", "pay", "applied", "1", "", "", TRACE],
            ),
            "slot_acquire": (self.provider, ["h1", 60000, 4, 1]),
            "slot_release": (self.provider, ["h1", "throttled", 1000]),
            "record_job_failure": (self.run[:1], ["shard 0: RuntimeError: boom"]),
            "end_failure_streak": (self.run[:1], []),
            "start_backoff": (self.run[:1], ["0", 1000]),
            "record_age": ([self.run[0], f"{self.run[0]}:ages"], [1000, 10000, 1440, "1.5", 1, 3]),
            "count_finished": (self.tallies[:2], [f"{RUN}@1000", "succeeded", 60000]),
            "count_missed": ([self.tallies[0], self.tallies[2]], ["2024-01-01", "2024-01-02"]),
            "record_lost_run": ([self.tallies[0], self.tallies[3]], [RUN, '{"run_id": "x"}']),
            "observe_data_set": ([self.store.keys.data_set], ["", 0, 0, "", "d1"]),
            "tick_leader": ([self.store.keys.tick_leader], ["w1", "hold", 10000, 1, "[]"]),
            "declare_jobs": (
                self.store.keys.tick_declared,
                ["w1#1", '{"worker": "w1", "jobs": {"nightly": "app.jobs:nightly"}}', 60000],
            ),
            "tick_lock": (
                [keys.job_tick_lock("nightly"), keys.job_tick_fence("nightly")],
                ["owner-1", 1, 60000],
            ),
        }

    def dump(self) -> dict[str, tuple[Any, int]]:
        """Content (helpers.stable_dump) and PTTL of every key under the store's prefix."""
        keys = sorted(text(k) for k in self.client.scan_iter(match=f"{self.store.prefix}:*"))
        return {k: (stable_dump(self.client, k), self.client.pttl(k)) for k in keys}


Mutation = Callable[[list[str], list[Any]], tuple[list[str], list[Any]]]


def _replace(index: int, value: Any) -> Mutation:
    return lambda keys, args: (keys, [*args[:index], value, *args[index + 1 :]])


def _guarded(key_of: Callable[[list[str]], str]) -> Mutation:
    delete = json.dumps([{"do": "del", "key": 1}])
    return lambda keys, args: ([*keys[:8], key_of(keys)], [*args[:4], "[]", delete, ""])


def _other(keys: list[str], index: int, change: str) -> list[str]:
    """``keys`` with key ``index`` (when there is one) moved to another tag or name."""
    if index >= len(keys):
        return keys
    key = keys[index]
    moved = key.replace("{", "{x", 1) if change == "{x" else key + change
    return [*keys[:index], moved, *keys[index + 1 :]]


def _tag(keys: list[str]) -> str:
    return keys[0].split("{", 1)[1].split("}", 1)[0]


def _prefix(keys: list[str]) -> str:
    return keys[0].split(":{", 1)[0]


def mutations(name: str, arity: int) -> Iterator[Mutation]:
    """Ways to spoil a valid call: each argument replaced by each hostile value, wrong shapes.

    They are applied to the scene's valid call as it is when each one runs (a
    call that succeeded is followed by a fresh scene with new tokens).
    """
    for index in range(arity):
        for value in HOSTILE:
            yield _replace(index, value)
        yield lambda keys, args, n=index: (keys, args[:n])  # the rest missing
    yield lambda keys, args: (keys[:-1], args)  # a key short
    yield lambda keys, args: ([*keys, keys[0]], args)  # one too many (commit: its own meta)
    yield lambda keys, args: ([], args)
    yield lambda keys, args: ([*keys[1:2], keys[0], *keys[2:]], args)  # two keys swapped
    for index in range(10):  # a key of another shard, or of another name, in its place
        yield lambda keys, args, n=index: (_other(keys, n, "{x"), args)
        yield lambda keys, args, n=index: (_other(keys, n, ":x"), args)
    if name != "commit":
        return
    for conditions in GUARDS:
        yield lambda keys, args, c=conditions: (keys, [*args[:4], c, "[]", ""])
    for writes in WRITES:
        yield lambda keys, args, w=writes: (keys, [*args[:4], "[]", w, ""])
    for own in range(8):  # the shard's own keys
        yield _guarded(lambda keys, n=own: keys[n])
    yield _guarded(lambda keys: f"{_prefix(keys)}:{{{_tag(keys)}}}:effects")
    yield _guarded(lambda keys: f"{_prefix(keys)}:{{{RUN}#1}}:app")  # another shard's tag
    yield _guarded(lambda keys: f"{_prefix(keys)}:{{other}}:app")
    yield _guarded(lambda keys: f"{_prefix(keys)}:runs")  # the store's untagged keys
    twice = json.dumps([{"do": "hset", "key": 1, "fields": {"f": "v"}}, {"do": "sadd", "key": 2,
                        "members": ["m"]}])  # fmt: skip
    yield lambda keys, args: ([*keys[:8], keys[8], keys[8]], [*args[:4], "[]", twice, ""])


def check_consistent(client: redis.Redis, shard_keys: list[str]) -> None:
    """Every record in exactly its state's index with a finite score; no orphan entries."""
    _meta, _counts, items, due, leases, held, dead = shard_keys
    records = read_items(client.hgetall(items))
    index = {
        name: {text(m): s for m, s in client.zrange(key, 0, -1, withscores=True)}
        for name, key in (("pending", due), ("leased", leases), ("held", held), ("dead", dead))
    }
    for name, entries in index.items():
        for member, score in entries.items():
            assert member in records, f"{name} index entry {member} has no record"
            assert math.isfinite(score), f"{member} scored {score} in {name}"
    for item_id, rec in records.items():
        where = {name for name, entries in index.items() if item_id in entries}
        expected = {"pending": {"pending"}, "leased": {"leased", "held"}, "dead": {"dead"}}
        assert where == expected.get(rec["state"], set()), f"{item_id} {rec['state']} in {where}"
        if rec["state"] == "leased":
            assert index["leased"][item_id] == rec["expires_at"], f"{item_id}: two expiries"


def call(store: LeaseStore, name: str, keys: list[str], args: list[Any]) -> Any:
    script = store.scripts[name]
    try:
        return store.client.evalsha(script.sha, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        return store.client.eval(script.script, len(keys), *keys, *args)


@pytest.mark.parametrize("name", sorted(KEY_COUNTS))
@pytest.mark.not_on_cluster("the cluster client refuses keys of two slots before sending")
# A client in another language sends these to a real server; the embedded backend runs the
# same scripts for Python callers only, whose arguments the store checks before sending.
@pytest.mark.backends("redis")
def test_hostile_arguments_are_refused_cleanly_or_succeed_consistently(
    store: LeaseStore, name: str
) -> None:
    scene = Scene(store)
    documented = documented_errors(name)
    refused = 0
    for mutate in mutations(name, len(scene.valid_calls()[name][1])):
        bad_keys, bad_args = mutate(*scene.valid_calls()[name])
        before = scene.dump()
        log_before = store.client.xrange(scene.logged[7])
        try:
            call(store, name, bad_keys, bad_args)
        except redis.ResponseError as error:
            message = str(error)
            code = message.split(" ", 1)[0]
            assert code in documented, f"{name}{bad_args!r} {bad_keys!r}: {message}"
            assert "user_script" not in message and "attempt to" not in message, message
            after = scene.dump()
            if code == "LEASE_LOST":
                counts, log = scene.shard[1], scene.logged[7]
                before.pop(counts), after.pop(counts), before.pop(log, None), after.pop(log)
                check_one_refusal_logged(log_before, store.client.xrange(log))
            assert after == before, f"{name}{bad_args!r} was refused but changed keys"
            refused += 1
        else:
            check_consistent(store.client, scene.shard)
            _reset(store)  # start the next variation from the scene again
            scene = Scene(store)
        check_consistent(store.client, scene.shard)
    assert refused > 0, f"{name}: no hostile call was refused"


def check_one_refusal_logged(entries_before: list[Any], entries_after: list[Any]) -> None:
    """A LEASE_LOST refusal added exactly one entry to the attempt log: a ``refused`` one."""
    assert entries_after[: len(entries_before)] == entries_before
    assert [text(fields[b"event"]) for _, fields in entries_after[len(entries_before) :]] == [
        "refused"
    ]


def _reset(store: LeaseStore) -> None:
    keys = list(store.client.scan_iter(match=f"{store.prefix}:*"))
    if keys:
        store.client.delete(*keys)


def test_every_valid_call_of_the_scene_succeeds(store: LeaseStore) -> None:
    """The baseline the hostile test varies is itself accepted (so the refusals mean something)."""
    assert set(Scene(store).valid_calls()) == set(KEY_COUNTS)
    for name in KEY_COUNTS:
        _reset(store)
        scene = Scene(store)
        keys, args = scene.valid_calls()[name]
        call(store, name, keys, args)
        check_consistent(store.client, scene.shard)
