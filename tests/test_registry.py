"""The script registry: every file registered, headers that match the host, errors mapped."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.commands.core import Script

from redis_lease import (
    CommitReply,
    ConditionFailed,
    FailReply,
    InvalidInput,
    Item,
    LeaseError,
    LeaseLost,
    LeaseStore,
    NotClaimable,
    NotFound,
    RunClosed,
    Write,
    limits,
)
from redis_lease.protocol import validation
from redis_lease.protocol.error_replies import from_reply
from redis_lease.protocol.guards import KeyMissing
from redis_lease.protocol.replies import DECODERS
from redis_lease.protocol.scripts import KEY_COUNTS, LOGGED, Call, Scripts, lua_dir, source
from tests.helpers import text
from tests.redis_server import RedisServer

NAMES = sorted(KEY_COUNTS)
#: The scripts that LeaseStore's own operations call.
STORE_SCRIPTS = {
    "add_items", "claim", "claim_next", "renew", "commit", "fail", "release", "reap", "requeue",
    "close_shard", "create_run", "settle",
}  # fmt: skip
CODE = re.compile(r"\b[A-Z][A-Z_]{3,}\b")
#: The class each documented error code must become.
EXPECTED_CLASS: dict[str, type[LeaseError]] = {
    "INVALID": InvalidInput,
    "NOT_FOUND": NotFound,
    "NOT_CLAIMABLE": NotClaimable,
    "LEASE_LOST": LeaseLost,
    "RUN_CLOSED": RunClosed,
    "CONDITION_FAILED": ConditionFailed,
}


def raw(name: str) -> str:
    return (lua_dir() / f"{name}.lua").read_text()


def header(name: str) -> list[str]:
    """The opening comment block of a script file, without the comment marks."""
    lines = []
    for line in raw(name).splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[3:])
    return lines


def documented_errors(name: str) -> set[str]:
    """The error codes named in the header's ``Errors:`` entry and its indented lines."""
    codes: set[str] = set()
    inside = False
    for line in header(name):
        if line.startswith("Errors:"):
            inside = True
        elif not line.startswith("  "):
            inside = False
        if inside:
            codes |= set(CODE.findall(line))
    return codes


def body_errors(text_: str) -> set[str]:
    """The error codes a Lua text replies with."""
    return set(re.findall(r"(?:fail|error_reply)\('([A-Z_]+)[ ']", text_))


def test_every_lua_file_is_registered_and_every_registered_name_has_a_file() -> None:
    files = {path.stem for path in lua_dir().glob("*.lua")}
    assert files == set(KEY_COUNTS)
    assert (lua_dir() / "include" / "shard_keys.lua").is_file()


@pytest.mark.parametrize("name", NAMES)
def test_header_documents_the_keys_the_host_passes(name: str) -> None:
    lines = "\n".join(header(name))
    numbered = sorted({int(n) for n in re.findall(r"KEYS\[(\d+)\]", lines)})
    assert numbered == list(range(1, KEY_COUNTS[name] + 1)), f"{name}: KEYS lines {numbered}"
    variadic = [int(n) for n in re.findall(r"KEYS\[(\d+)\.\.\.\]", lines)]
    if name == "commit":
        assert variadic == [KEY_COUNTS[name] + 1], "commit documents its guarded keys"
    else:
        assert variadic == []


@pytest.mark.parametrize("name", NAMES)
def test_header_documents_argv_in_order_and_the_reply(name: str) -> None:
    lines = "\n".join(header(name))
    numbered = sorted({int(n) for n in re.findall(r"ARGV\[(\d+)\]", lines)})
    if "(no ARGV)" in lines:
        assert numbered == []
    else:
        tail_only = "ARGV[1...]" in lines
        assert numbered == list(range(1, len(numbered) + 1)), f"{name}: {numbered}"
        assert numbered or tail_only, f"{name} documents no ARGV"
    assert "Returns:" in lines


@pytest.mark.parametrize("name", NAMES)
def test_expanded_source_is_complete(name: str) -> None:
    text_ = source(name)
    assert not re.search(r"^-- @include", text_, re.MULTILINE)
    assert "local rcall = redis.call" in text_
    assert "local LIMITS = {" in text_, "the bounds table is expanded into every script"
    assert "local function check_args(" in text_
    if '@include "shard_keys.lua"' in raw(name):
        assert "local LOGGED_KEYS = " in text_


_LUA_NOISE = re.compile(
    r"--\[(=*)\[.*?\]\1\]|--[^\n]*|\[(=*)\[.*?\]\2\]|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"",
    re.DOTALL,
)
_OPENS, _CLOSES = {"function", "if", "do", "repeat"}, {"end", "until"}


def top_level_returns(lua: str) -> list[str]:
    """The lines (stripped) of a Lua text that hold a ``return`` outside every function, one
    that ends the script; words in comments and strings are not read."""
    code = _LUA_NOISE.sub(lambda m: " " + "\n" * m.group().count("\n"), lua)
    lines = lua.splitlines()
    found: list[str] = []
    blocks: list[str] = []
    for word in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", code):
        if word.group() in _OPENS:
            blocks.append(word.group())
        elif word.group() in _CLOSES:
            blocks.pop()
        elif word.group() == "return" and "function" not in blocks:
            found.append(lines[code.count("\n", 0, word.start())].strip())
    assert not blocks, "unbalanced blocks"
    return found


def test_top_level_returns_are_found_outside_blocks_only() -> None:
    lua = (
        "local function main()\n  if x then return 1 end\n  for i = 1, 2 do end\n"
        "  repeat y() until z\n  return 2\nend\n"
        "if bad then return 'x' end  -- return in a comment\n"
        "local s = 'return' .. [[return]]\nreturn flushed(main)\n"
    )
    assert top_level_returns(lua) == [
        "if bad then return 'x' end  -- return in a comment",
        "return flushed(main)",
    ]


_INCLUDE_LINE = re.compile(r'^-- @include "([a-z_]+)\.lua"$', re.MULTILINE)
_TOP_LEVEL = re.compile(r"^local function (\w+)|^local ([\w, ]+?)\s*=", re.MULTILINE)


def top_level_names(lua: str) -> set[str]:
    """The names a Lua text defines outside every function (``local x`` at column 0)."""
    names: set[str] = set()
    for function, many in _TOP_LEVEL.findall(_LUA_NOISE.sub(" ", lua)):
        names |= {function} if function else {name.strip() for name in many.split(",")}
    return names


def test_every_lua_file_includes_the_files_of_the_names_it_uses() -> None:
    """A script or include that uses a name another include defines names that include
    itself, so each file's header tells what it is made of (not only its includes' includes)."""
    includes = sorted((lua_dir() / "include").glob("*.lua"))
    owners: dict[str, set[str]] = {}
    for path in includes:
        for name in top_level_names(path.read_text()):
            owners.setdefault(name, set()).add(path.stem)
    assert owners["flushed"] == {"staged"} and owners["held"] == {"holder_check"}
    missing = []
    for path in sorted(lua_dir().glob("*.lua")) + includes:
        text_ = path.read_text()
        named = set(_INCLUDE_LINE.findall(text_))
        code = _LUA_NOISE.sub(" ", text_)
        used = set(re.findall(r"(?<![\w.:])([A-Za-z_]\w*)", code)) - top_level_names(text_)
        missing += [
            f"{path.name}: {n}" for n in sorted(used) if n in owners and not owners[n] & named
        ]
    assert missing == []


#: The scripts that stage writes (they include staged.lua, directly or through another include).
STAGING = [name for name in NAMES if "local function flushed(" in source(name)]


@pytest.mark.parametrize("name", STAGING)
def test_a_staging_script_returns_only_through_flushed(name: str) -> None:
    """Its one top-level return is ``return flushed(main)``, and it calls flush nowhere: every
    return of its body, early or not, sends the writes it staged (include/staged.lua)."""
    own = raw(name)
    assert top_level_returns(own) == ["return flushed(main)"], name
    assert own.rstrip().endswith("return flushed(main)"), name
    assert not re.search(r"(?<![\w.])flush\(", _LUA_NOISE.sub(" ", own)), name


def test_only_staged_lua_sends_staged_writes() -> None:
    """No include but staged.lua calls flush (an include's function returns to a script)."""
    for path in sorted((lua_dir() / "include").glob("*.lua")):
        calls = re.findall(r"(?<![\w.])flush\(", _LUA_NOISE.sub(" ", path.read_text()))
        assert not calls or path.name == "staged.lua", path.name
    assert len(STAGING) >= 12  # every shard script that writes: add_items, claim, ...


@pytest.mark.parametrize("name", NAMES)
def test_the_lua_bounds_are_the_python_bounds(name: str) -> None:
    """Each script's LIMITS holds, with limits.json's values, every bound and default it names."""
    text_ = source(name)
    table_line = next(line for line in text_.splitlines() if line.startswith("local LIMITS = "))
    body = text_.replace(table_line, "")
    for part in ("bounds", "defaults"):
        for key, value in limits.table()[part].items():
            literal = f"{key} = {{{value[0]}, {value[1]}}}" if part == "bounds" else f"{key} = "
            named = re.search(rf"\b{key}\b", body) is not None
            assert (literal in table_line) == named, f"{name}: {part} {key}"
            if named and part == "defaults":
                assert f"{key} = {json.dumps(value)}" in table_line
    assert limits.TTL_MAX_MS == limits.bound("ttl_ms")[1] == validation.TTL_MAX_MS


#: The errors each prelude function can reply with (lua/include/*.lua).
PRELUDE_ERRORS = {
    "held(": {"LEASE_LOST", "NOT_FOUND"},
    "barred(": {"RUN_CLOSED"},
    "check_args(": {"INVALID"},
    "check_rest(": {"INVALID"},
    "check_keys(": {"INVALID"},
    "put(": {"INVALID"},
}


@pytest.mark.parametrize("name", NAMES)
def test_every_error_a_script_replies_with_is_in_its_header(name: str) -> None:
    own = raw(name)
    used = body_errors(own)
    for call, codes in PRELUDE_ERRORS.items():
        if re.search(rf"(?<![\w.]){re.escape(call)}", own):
            used |= codes
    if '@include "guards.lua"' in own:
        used |= body_errors((lua_dir() / "include" / "guards.lua").read_text())
    assert used <= documented_errors(name), f"{name} replies with undocumented {used}"
    assert "INVALID" in documented_errors(name), f"{name} must document INVALID"


ANNOTATION = re.compile(r"\((int|num|id\??|text|json)(?:, bound (\w+))?\)|\(one of ([^)]*)\)")
SPEC = re.compile(r"\{(\d+), '(int|num|id\??|text|json|one)'(?:, '(\w+)')?")
REST = re.compile(r"check_rest\((\d+), \{(.*?)\}\}?, '(\w+)'\)")


def header_arguments(name: str) -> tuple[set[tuple[int, str, str | None]], dict[int, list[str]]]:
    """The ARGV entries a header documents: (index, kind, bound), and variadic tails' kinds."""
    fixed: set[tuple[int, str, str | None]] = set()
    rest: dict[int, list[str]] = {}
    for line in header(name):
        match = re.match(r"ARGV\[(\d+)(\.\.\.)?\]", line)
        if not match:
            continue
        found = ANNOTATION.findall(line)
        assert found, f"{name}: ARGV[{match.group(1)}] does not say its kind: {line}"
        if match.group(2):
            rest[int(match.group(1))] = [kind for kind, _bound, _one in found]
        else:
            kind, bound, one = found[0]
            fixed.add((int(match.group(1)), "one" if one else kind, bound or None))
    return fixed, rest


@pytest.mark.parametrize("name", NAMES)
def test_every_argument_is_checked_as_its_header_says(name: str) -> None:
    """Each documented ARGV entry is checked by check_args/check_rest with its kind and bound."""
    fixed, rest = header_arguments(name)
    body = raw(name).split("@include", 1)[-1] if "@include" in raw(name) else raw(name)
    checked = {(int(i), kind, bound or None) for i, kind, bound in SPEC.findall(body)}
    checked_fixed = {entry for entry in checked if entry[0] not in rest}
    assert checked_fixed == fixed, f"{name}: header {sorted(fixed)} vs checks {sorted(checked)}"
    for index, kind, bound in fixed:
        if kind in ("int", "num"):
            assert bound in limits.table()["bounds"], f"{name}: ARGV[{index}] has no known bound"
    tails = {
        int(i): re.findall(r"'(int|num|id\??|text|json)'", kinds)
        for i, kinds, _ in REST.findall(body)
    }
    if rest and not tails and "local function check_groups(" in body:
        # Groups whose detail depends on their operation (settle): one pass, check_value per
        # argument (or an inline check that refuses with check_value's reason), the
        # per-operation kinds in a table.
        used = set(re.findall(r"check_value\('(int|num|id\??|text|json)'", body))
        # checks inlined for speed name their kind where they refuse: refuse(index, kind, ...)
        used |= set(re.findall(r"refuse\([^,]+, '(int|num|id\??|text|json)'", body))
        used |= set(re.findall(r"\{'(int|num|id\??|text|json)'", body))
        for index, kinds in rest.items():
            assert set(kinds) <= used, f"{name}: ARGV[{index}...] kinds {kinds} vs checks {used}"
        return
    assert tails == rest, f"{name}: variadic header {rest} vs checks {tails}"
    if "(no ARGV)" not in "\n".join(header(name)):
        assert "check_args(" in body or "check_rest(" in body
    assert "check_keys(" in body, f"{name} must check its keys"


def test_the_logged_scripts_are_the_ones_whose_header_takes_the_attempt_log() -> None:
    taking = {n for n in NAMES if re.search(r"KEYS\[8\] attempts\b", "\n".join(header(n)))}
    assert taking == LOGGED


def test_a_commit_and_a_failure_have_one_reply_type_whichever_script_sent_them(
    store: LeaseStore,
) -> None:
    """commit, fail and settle decode into the public CommitReply and FailReply themselves."""
    store.add("r", [Item("a"), Item("b"), Item("c"), Item("d")], shards=1)
    a, b, c, d = (store.claim("r", item, "w") for item in "abcd")
    committed = store.commit(a, {"n": 1})
    assert committed == CommitReply(a.token, {"n": 1}, committed.done_at_ms, repeated=False)
    failed = store.fail(b, "boom")
    assert type(failed) is FailReply and failed.state == "retry" and failed.now_ms > 0
    rows = store.scripts.call(
        "settle",
        store.keys.logged("r", 0),
        ["commit", "c", c.token, c.lease_id, '{"n":2}', "", "",
         "fail", "d", d.token, d.lease_id, "no", "permanent", ""],
    )  # fmt: skip
    assert [type(row) for row in rows] == [CommitReply, FailReply]
    assert rows[0].result == {"n": 2} and rows[1].state == "dead"


def test_every_script_has_one_reply_decoder() -> None:
    assert set(DECODERS) == set(KEY_COUNTS)


def test_every_documented_error_maps_to_a_lease_error_subclass() -> None:
    codes = set().union(*(documented_errors(n) for n in NAMES))
    assert {"LEASE_LOST", "NOT_CLAIMABLE", "NOT_FOUND", "RUN_CLOSED", "INVALID"} <= codes
    detail = "item=a run=r token=1 current_token=2 state=leased until=5 condition=1"
    for code in sorted(codes):
        error = from_reply(redis.ResponseError(f"{code} {detail}"), run_id="r", item_id="a")
        assert isinstance(error, LeaseError) and type(error) is not LeaseError, code
        if code in EXPECTED_CLASS:
            assert type(error) is EXPECTED_CLASS[code], code
        assert error.run_id == "r" and error.item_id == "a"
    unknown = from_reply(redis.ResponseError("SOMETHING_ELSE x=1"))
    assert type(unknown) is LeaseError


def test_mapped_errors_carry_the_reply_fields() -> None:
    lost = from_reply(redis.ResponseError("LEASE_LOST item=a token=1 current_token=4"), token=1)
    assert isinstance(lost, LeaseLost) and lost.current_token == 4 and lost.token == 1
    held = from_reply(redis.ResponseError("NOT_CLAIMABLE item=a state=leased until=1700000000000"))
    assert isinstance(held, NotClaimable)
    assert (held.state, held.until_ms) == ("leased", 1700000000000)
    assert "2023-11-14T22:13:20" in held.message
    failed = from_reply(redis.ResponseError("CONDITION_FAILED item=a condition=3"))
    assert isinstance(failed, ConditionFailed) and failed.condition == 3


@pytest.mark.parametrize("name", NAMES)
def test_every_script_loads_on_the_server_with_the_registered_sha(
    store: LeaseStore, name: str
) -> None:
    text_ = source(name)
    sha = text(store.client.script_load(text_))
    assert sha == store.scripts[name].sha == hashlib.sha1(text_.encode()).hexdigest()
    assert store.client.script_exists(sha) == [True]


def test_the_host_passes_the_documented_number_of_keys(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = {store.scripts[n].sha: n for n in NAMES}
    calls: list[tuple[str, int]] = []
    original: Callable[..., Any] = Script.__call__

    def spy(self: Script, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        calls.append((names.get(self.sha, "?"), len(keys or [])))
        return original(self, keys=keys, args=args, client=client)

    original_many: Callable[..., Any] = Scripts.many

    def spy_many(self: Scripts, batch: Any) -> Any:
        calls.extend((c.name, len(c.keys)) for c in batch if isinstance(c, Call))
        return original_many(self, batch)

    monkeypatch.setattr(Script, "__call__", spy)
    monkeypatch.setattr(Scripts, "many", spy_many)
    store.add("r", [Item("a"), Item("b"), Item("c")], shards=2)
    lease = store.renew(store.claim("r", "a", "w"))
    [lease] = store.renew_many([lease])
    assert lease is not None
    guard = f"{store.prefix}:{{r#{lease.shard}}}:guard"
    store.commit(lease, "ok", conditions=[KeyMissing(guard)], writes=[Write.sadd(guard, ["x"])])
    for other in store.claim_next("r", "w", limit=2):
        if other.item_id == "b":
            store.release(other)
        else:
            store.fail(other, "boom", permanent=True)
    store.reap("r")
    store.requeue("r")
    store.set_closed("r", True)
    store.status("r")

    seen = {name for name, _ in calls}
    assert seen >= STORE_SCRIPTS, f"not exercised: {STORE_SCRIPTS - seen}"
    for name, count in calls:
        expected = KEY_COUNTS[name] + (1 if name == "commit" else 0)
        assert count == expected, f"{name} got {count} keys"


def test_scripts_reload_after_script_flush(private_redis: Callable[..., RedisServer]) -> None:
    server = private_redis()
    store = LeaseStore.from_url(server.url, prefix="rl")
    try:
        store.add("r", [Item("a"), Item("b")])
        lease = store.claim("r", "a", "w")
        assert store.client.script_flush()
        assert store.client.script_exists(store.scripts["commit"].sha) == [False]
        assert store.commit(lease, "ok").repeated is False  # EVALSHA, NOSCRIPT, reload
        assert store.client.script_exists(store.scripts["commit"].sha) == [True]

        store.client.script_flush()
        status = store.status("r")  # scripts queued in a pipeline are loaded before it runs
        assert status.counts == {"pending": 1, "leased": 0, "done": 1, "dead": 0}

        for transaction in (True, False):
            store.client.script_flush()
            logged = store.keys.logged("r", 0)
            pipe = store.client.pipeline(transaction=transaction)
            store.scripts.run("claim_next", logged, ["w", f"B{transaction}", 60000, 1], client=pipe)
            store.scripts.run("shard_status", store.keys.status("r", 0), [], client=pipe)
            rows, snap = pipe.execute()
            if transaction:
                assert [text(r[0]) for r in rows] == ["b"]
            else:
                assert rows == []  # the first pass took the only due item
            counts = dict(zip(text(snap[0][::2]), map(int, snap[0][1::2]), strict=True))
            assert (counts["pending"], counts["leased"]) == (0, 1)
    finally:
        store.client.close()


def test_scripts_queue_in_a_pipeline(store: LeaseStore) -> None:
    keys = store.keys.shard("r", 0)
    scripts = Scripts(store.client)
    pipe = store.client.pipeline(transaction=True)
    scripts.run("add_items", keys, ["r", 0, 3, 1000, 60000, 0, "a", "{}", "b", "{}"], client=pipe)
    scripts.run("claim_next", store.keys.logged("r", 0), ["w", "B", 60000, 5], client=pipe)
    scripts.run("shard_status", store.keys.status("r", 0), [], client=pipe)
    added, rows, snap = pipe.execute()
    assert added == [1, 1]
    assert sorted(text(r[0]) for r in rows) == ["a", "b"]
    assert [int(r[1]) for r in rows] == [1, 1]
    counts = dict(zip(text(snap[0][::2]), map(int, snap[0][1::2]), strict=True))
    assert counts == {"pending": 0, "leased": 2, "dead": 0, "claims": 2, "added": 2}


def test_script_errors_in_a_pipeline_are_returned_per_command(store: LeaseStore) -> None:
    pipe = store.client.pipeline(transaction=False)
    store.scripts.run("claim", store.keys.logged("r", 0), ["missing", "w", "L", 1000], client=pipe)
    store.scripts.run("shard_status", store.keys.status("r", 0), [], client=pipe)
    error, snap = pipe.execute(raise_on_error=False)
    assert isinstance(error, redis.ResponseError)
    assert isinstance(from_reply(error), NotFound)
    assert text(snap[1]) == ""
