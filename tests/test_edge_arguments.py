"""Every argument a script's header documents is enforced by the script itself.

The hostile and fuzz tests accept a call that succeeds as long as the shard stays
consistent, and the registry test reads the checks' text. Neither shows that a value
outside its documented kind or bound is refused: a script that read a bad delay as 0,
or a TTL past its bound, would pass them. Here each documented argument of every
script, and each argument of settle's groups, is sent through raw ``EVALSHA`` with
values just past its bound and of the wrong form; each must be refused with
``INVALID ARGV[n]`` and change no key, and the bound itself must be accepted. Guard
specs of undocumented shapes and guarded keys that are not the caller's own must be
refused too (not merely leave the shard consistent).

Runs on real Redis and on fakeredis (the ``store`` fixture); the tests that accept a value
run on the Redis Cluster too. A refusal is decided by the script's Lua from its arguments,
and a cluster node runs the same Lua as a lone Redis, so the refusals run on the two Lua
engines only (Redis's and fakeredis's).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from redis_lease import LeaseStore, limits
from redis_lease.protocol.scripts import KEY_COUNTS
from tests.fuzz_values import Kind, argv_kinds
from tests.test_hostile_protocol import GUARDS, RUN, TRACE, WRITES, Scene, _reset, call
from tests.test_registry import header

NAMES = sorted(KEY_COUNTS)
#: The backends of the refusals: a cluster node runs the same Lua as a lone Redis.
REFUSAL_BACKENDS = ("redis", "fakeredis")
#: Forms no numeric argument may take, whatever its bound.
NOT_NUMBERS = ["nan", "-nan", "inf", "-inf", "0x10", "abc", " 5", "5 ", "1,5", "--1", "+"]
#: Forms no integer argument may take (a number, but not written as an integer).
NOT_INTEGERS = ["1e3", "1.5", "1.0", "99999999999999999999"]
NOT_IDS = ["a b", "x" * (limits.ID_MAX_LENGTH + 1), "{x}", "a\x00b", "a\nb", "é"]
NOT_JSON = ["nan", "{", "01", "+1", "0x10", "[1,]", "{'a': 1}", "[" * 40 + "]" * 40]


def _number(value: float) -> str:
    """``value`` written as the protocol writes numbers (integers without a fraction)."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def refused_values(kind: Kind, empty_allowed: bool = False) -> list[str]:
    """Values that an argument of ``kind`` (kind, bound, words) must refuse; ``empty_allowed``:
    its header gives '' a meaning (none, the default)."""
    name, bound, words = kind
    if name in ("int", "num"):
        assert bound is not None
        low, high = limits.bound(bound)
        step = 1 if name == "int" else 0.001
        past = [_number(low - step), _number(high + step)]
        return past + NOT_NUMBERS + (NOT_INTEGERS if name == "int" else [])
    if name == "id":
        return ["", *NOT_IDS]
    if name == "id?":
        return NOT_IDS
    if name == "one":
        assert words is not None
        return [w for w in ("maybe", "2", "none", "TRUE") if w not in words]
    if name == "text":
        assert bound is not None
        low, high = limits.bound(bound)
        return ["x" * (high + 1)] + ([""] if low > 0 and not empty_allowed else [])
    if name == "json":
        assert bound is not None
        return [*NOT_JSON, json.dumps("x" * limits.bound(bound)[1])]
    raise AssertionError(f"unknown kind {name}")


def accepted_values(kind: Kind) -> list[str]:
    """The ends of a numeric argument's bound, which it must accept."""
    name, bound, _ = kind
    if name not in ("int", "num") or bound is None:
        return []
    return [_number(end) for end in limits.bound(bound)]


def empty_allowed(name: str, index: int) -> bool:
    """Whether the header line of ``name``'s ARGV[index] gives '' a meaning."""
    [line] = [line for line in header(name) if line.startswith(f"ARGV[{index}] ")]
    return "''" in line or "default" in line


def fixed_arguments() -> Iterator[tuple[str, int, Kind]]:
    """(script, ARGV index, kind) of every fixed argument a header documents."""
    for name in NAMES:
        fixed, _first, _rest, _most = argv_kinds(name)
        for index, kind in sorted(fixed.items()):
            yield name, index, kind


FIXED = list(fixed_arguments())


def refuse(scene: Scene, name: str, keys: list[str], args: list[Any], index: int | str) -> str:
    """Calls ``name`` and asserts an ``INVALID`` refusal naming ``index`` that changed no key;
    returns the message."""
    before = scene.dump()
    with pytest.raises(redis.ResponseError) as info:
        call(scene.store, name, keys, args)
    message = str(info.value)
    where = f"ARGV[{index}]" if isinstance(index, int) else index
    assert message.startswith("INVALID ") and where in message, f"{name}{args!r}: {message}"
    assert scene.dump() == before, f"{name}{args!r} was refused but changed keys"
    return message


def test_every_documented_argument_is_covered() -> None:
    """The tables below reach every script that takes ARGV (settle through its groups, the
    scripts with only a tail through their tails)."""
    with_argv = {name for name in NAMES if any(argv_kinds(name)[0]) or argv_kinds(name)[1]}
    assert {name for name, _, _ in FIXED} | set(TAIL_GROUPS) | {"settle"} == with_argv
    assert all(refused_values(kind) for _, _, kind in FIXED)


@pytest.mark.backends(*REFUSAL_BACKENDS)
@pytest.mark.parametrize(("name", "index", "kind"), FIXED, ids=[f"{n}-{i}" for n, i, _ in FIXED])
def test_an_argument_outside_its_kind_or_bound_is_refused(
    store: LeaseStore, name: str, index: int, kind: Kind
) -> None:
    scene = Scene(store)
    for value in refused_values(kind, empty_allowed(name, index)):
        keys, args = scene.valid_calls()[name]
        bad = [*args[: index - 1], value, *args[index:]]
        refuse(scene, name, keys, bad, index)


@pytest.mark.parametrize(
    ("name", "index", "kind"),
    [entry for entry in FIXED if accepted_values(entry[2])],
    ids=[f"{n}-{i}" for n, i, k in FIXED if accepted_values(k)],
)
def test_the_ends_of_a_bound_are_accepted(
    store: LeaseStore, name: str, index: int, kind: Kind
) -> None:
    """A bound is inclusive at both ends: an end may meet another refusal, never INVALID."""
    for value in accepted_values(kind):
        scene = Scene(store)
        keys, args = scene.valid_calls()[name]
        try:
            call(store, name, keys, [*args[: index - 1], value, *args[index:]])
        except redis.ResponseError as error:
            assert not str(error).startswith(f"INVALID ARGV[{index}]"), f"{name} {value}: {error}"
        _reset(store)


# -- settle's groups: each operation's detail and option ----------------------------------

TTL_LOW, TTL_HIGH = limits.bound("ttl_ms")
DELAY_HIGH = limits.bound("delay_ms")[1]
#: (operation, detail, option) of groups settle must refuse, and the ARGV slot named.
SETTLE_REFUSED: list[tuple[str, str, str, int]] = [
    *[("release", v, "", 5) for v in ["abc", "nan", "-1", _number(DELAY_HIGH + 1), "1.5", "0x10"]],
    ("release", "0", "x", 6),
    *[("renew", v, "", 5) for v in ["0", _number(TTL_HIGH + 1), "inf", "1e3", ""]],
    ("renew", "1000", "x", 6),
    *[("fail", "boom", v, 6) for v in ["2", "-0.5", "nan", "inf", "0x1", "permanently"]],
    ("fail", "", "0", 5),
    ("fail", "x" * (limits.ERROR_MAX_BYTES + 1), "0", 5),
    *[("commit", v, "", 5) for v in NOT_JSON],
    ("commit", "{}", "a b", 6),
    ("expire", "", "", 1),
]
#: Groups at the ends of their bounds, which settle must accept.
SETTLE_ACCEPTED = [
    ("release", "0", ""),
    ("release", _number(DELAY_HIGH), ""),
    ("release", "", ""),
    ("renew", _number(TTL_LOW), ""),
    ("renew", _number(TTL_HIGH), ""),
    ("fail", "boom", "0"),
    ("fail", "boom", "1"),
    ("fail", "boom", "permanent"),
    ("commit", "null", ""),
]


def settle_args(scene: Scene, op: str, detail: str, option: str) -> list[Any]:
    """A valid renewal of the scene's lease, then the group under test."""
    lease = scene.lease
    holder = ["a", lease.token, lease.lease_id]
    return ["renew", *holder, 60000, "", TRACE, op, *holder, detail, option, TRACE]


@pytest.mark.backends(*REFUSAL_BACKENDS)
@pytest.mark.parametrize(
    ("op", "detail", "option", "slot"),
    SETTLE_REFUSED,
    ids=[f"{g[0]}-{g[3]}" for g in SETTLE_REFUSED],
)
def test_a_settle_group_outside_its_operations_bounds_refuses_the_call(
    store: LeaseStore, op: str, detail: str, option: str, slot: int
) -> None:
    """The whole call is refused, the valid renewal before the bad group included."""
    scene = Scene(store)
    args = settle_args(scene, op, detail, option)
    refuse(scene, "settle", scene.logged, args, 7 + slot)


@pytest.mark.parametrize(("op", "detail", "option"), SETTLE_ACCEPTED)
def test_a_settle_group_at_the_ends_of_its_bounds_is_accepted(
    store: LeaseStore, op: str, detail: str, option: str
) -> None:
    scene = Scene(store)
    rows = call(store, "settle", scene.logged, settle_args(scene, op, detail, option))
    assert len(rows) == 2 and rows[1][0] != b"refused", rows


# -- variadic tails -----------------------------------------------------------------------


def tail_cases() -> Iterator[tuple[str, int, str]]:
    """(script, offset in the tail's first group, value) for every tail value to refuse."""
    for name in NAMES:
        _fixed, first, rest, _most = argv_kinds(name)
        if not first or name == "settle":
            continue
        for offset, kind in enumerate(rest):
            for value in refused_values(kind):
                yield name, offset, value


TAILS = list(tail_cases())
#: A valid first tail group for each script with a tail (the scene's calls may have none).
TAIL_GROUPS = {
    "add_items": ["e", "{}"],
    "count_missed": ["2024-01-03"],
    "create_run": ["job", "j"],
    "requeue": ["c"],
    "run_transition": ["f", "v"],
    "take_shard_jobs": ["rl-2"],
}


def with_tail(scene: Scene, name: str) -> tuple[list[str], list[Any], int]:
    """The scene's valid call of ``name`` with one valid tail group; the tail's first index."""
    keys, args = scene.valid_calls()[name]
    first = argv_kinds(name)[1]
    return keys, [*args[: first - 1], *TAIL_GROUPS[name]], first


def test_every_tail_has_a_group() -> None:
    assert {name for name, _, _ in TAILS} == set(TAIL_GROUPS)


@pytest.mark.backends(*REFUSAL_BACKENDS)
@pytest.mark.parametrize(
    ("name", "offset", "value"), TAILS, ids=[f"{n}-{o}-{i}" for i, (n, o, _) in enumerate(TAILS)]
)
def test_a_tail_value_outside_its_kind_is_refused(
    store: LeaseStore, name: str, offset: int, value: str
) -> None:
    scene = Scene(store)
    keys, args, first = with_tail(scene, name)
    call(store, name, keys, args)  # the valid form is accepted
    _reset(store)
    scene = Scene(store)
    keys, args, first = with_tail(scene, name)
    index = first - 1 + offset
    refuse(scene, name, keys, [*args[:index], value, *args[index + 1 :]], first + offset)


@pytest.mark.parametrize(
    "name",
    [
        *sorted(set(TAIL_GROUPS) - {"requeue"}),
        pytest.param("requeue", marks=pytest.mark.real_redis_only("a million ids is too slow")),
    ],
)
def test_a_tail_past_its_group_count_or_cut_short_is_refused(store: LeaseStore, name: str) -> None:
    scene = Scene(store)
    keys, args, first = with_tail(scene, name)
    most = argv_kinds(name)[3]
    assert most is not None
    group = TAIL_GROUPS[name]
    many = limits.bound(most)[1] + 1
    tail = [f"{value}{n}" if value.isalpha() and len(group) > 1 and i == 0 else value
            for n in range(many) for i, value in enumerate(group)]  # fmt: skip
    if name == "requeue":
        tail = [f"c{n}" for n in range(many)]
    refuse(scene, name, keys, [*args[: first - 1], *tail], "at most")
    if len(group) > 1:
        refuse(scene, name, keys, [*args, group[0]], f"ARGV[{first}...]")


# -- guarded writes: refused, not merely harmless -----------------------------------------


def commit_call(
    scene: Scene, guarded: list[str], conditions: str, writes: str
) -> tuple[list[str], list[Any]]:
    lease = scene.lease
    return [*scene.logged, *guarded], ["a", lease.token, lease.lease_id, "{}", conditions, writes]


@pytest.mark.backends(*REFUSAL_BACKENDS)
@pytest.mark.parametrize("spec", [*GUARDS, '[{"if": "equals", "key": 1, "field": "f"}]'])
def test_conditions_of_undocumented_shapes_are_refused(store: LeaseStore, spec: str) -> None:
    scene = Scene(store)
    keys, args = commit_call(scene, [scene.guard], spec, "[]")
    refuse(scene, "commit", keys, args, "")
    assert store.item(RUN, "a").state == "leased"


@pytest.mark.backends(*REFUSAL_BACKENDS)
@pytest.mark.parametrize(
    "spec",
    [*WRITES, '[{"do": "hset", "key": 1}]', '[{"do": "zadd", "key": 1, "scores": {"m": "nan"}}]'],
)
def test_writes_of_undocumented_shapes_are_refused(store: LeaseStore, spec: str) -> None:
    scene = Scene(store)
    keys, args = commit_call(scene, [scene.guard], "[]", spec)
    refuse(scene, "commit", keys, args, "")
    assert store.item(RUN, "a").state == "leased"


def foreign_keys(scene: Scene) -> list[str]:
    """Keys a guarded write may not touch: the shard's own, its effects, another shard's,
    the store's untagged keys, another run's."""
    prefix = scene.store.prefix
    return [
        *scene.logged,
        *scene.effects,
        f"{prefix}:{{{RUN}#1}}:app",
        f"{prefix}:{{other}}:app",
        f"{prefix}:runs",
        f"{prefix}:app",
        scene.run[0],
    ]


@pytest.mark.not_on_cluster("the cluster client refuses keys of two slots before sending")
def test_a_guarded_key_that_is_not_the_callers_own_is_refused(store: LeaseStore) -> None:
    scene = Scene(store)
    delete = json.dumps([{"do": "del", "key": 1}])
    for key in foreign_keys(scene):
        keys, args = commit_call(scene, [key], "[]", delete)
        message = refuse(scene, "commit", keys, args, "guarded key 1")
        assert key not in message or "hash tag" in message or "own" in message, message
    keys, args = commit_call(scene, [scene.guard, scene.guard], "[]", delete)
    refuse(scene, "commit", keys, args, "repeats guarded key 1")
    keys, args = commit_call(scene, [scene.guard], "[]", delete)
    assert call(store, "commit", keys, args)[0] == b"committed", "the caller's own key is fine"
