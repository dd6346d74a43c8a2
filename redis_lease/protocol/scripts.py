"""The Lua scripts: loaded from ``lua/``, includes expanded, registered once per client.

A script file may say ``-- @include "name.lua"``; the line is replaced by
``lua/include/name.lua`` (includes nest; each file is expanded once per
script). ``-- @include "limits.json"`` becomes the Lua table ``LIMITS``, built from
that file with the bounds, defaults and run states the script names. :func:`source` gives the
expanded text, which is what any other language sends with ``EVAL``/``EVALSHA``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, NamedTuple, Protocol

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import AskError, MovedError, NoScriptError

from ..errors import NotReplicated
from ..limits import lua_dir, table
from .replies import DECODERS

#: Each script and the number of KEYS it takes (commit takes more: its guarded keys). The
#: scripts that end attempts take the shard's attempt log as their eighth key (LOGGED). The
#: last ones keep the fleet's records: a run's failed shard jobs, its ages, a job's tallies
#: and lost runs, the data set's mark; the tick leader's lease, the fenced lock of a
#: job's tick and the jobs the workers declared.
KEY_COUNTS: dict[str, int] = {
    "add_items": 7,
    "claim": 8,
    "claim_next": 8,
    "renew": 8,
    "commit": 8,
    "settle": 8,
    "fail": 8,
    "release": 8,
    "reap": 8,
    "cut_leases": 7,
    "requeue": 7,
    "close_shard": 7,
    "shard_status": 8,
    "create_run": 1,
    "run_transition": 2,
    "release_lock": 1,
    "record_effect": 10,
    "slot_acquire": 2,
    "slot_release": 2,
    "worker_beat": 2,
    "register_shard_job": 4,
    "shard_job_beat": 2,
    "sweep_shard_jobs": 4,
    "take_shard_jobs": 4,
    "record_job_failure": 1,
    "end_failure_streak": 1,
    "start_backoff": 1,
    "record_age": 2,
    "count_finished": 2,
    "count_missed": 2,
    "record_lost_run": 2,
    "observe_data_set": 1,
    "tick_leader": 1,
    "tick_lock": 2,
    "declare_jobs": 2,
}

#: The scripts that take the shard's attempt log as their eighth key: those that end attempts.
LOGGED = frozenset(
    ("claim", "claim_next", "renew", "commit", "settle", "fail", "release", "reap", "record_effect")
)

_INCLUDE = re.compile(r'^-- @include "([a-z_]+\.(?:lua|json))"$', re.MULTILINE)
#: Times a pipeline is sent again when the server lost its scripts meanwhile.
NOSCRIPT_RETRIES = 3

__all__ = [
    "KEY_COUNTS",
    "LOGGED",
    "Call",
    "Command",
    "Observer",
    "Scripts",
    "lua_dir",
    "observe",
    "source",
]


class Observer(Protocol):
    """Sees every script call of this process and how it ended (histories, tracing).

    :meth:`sent` runs before the call goes out and returns a ticket; exactly one
    of :meth:`answered` (the decoded reply, or the error reply the script gave)
    and :meth:`unanswered` (no reply: the call may or may not have run) follows.
    """

    def sent(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """A call is about to be sent; returns a ticket for the outcome."""

    def answered(self, ticket: Any, reply: Any) -> None:
        """The call's decoded reply, or the ``ResponseError`` the server answered."""

    def unanswered(self, ticket: Any, error: BaseException) -> None:
        """The call got no reply (a reset, a timeout): its outcome is unknown."""


_OBSERVERS: list[Observer] = []


def observe(observer: Observer) -> Callable[[], None]:
    """Shows every later script call of this process to ``observer``; returns its removal."""
    _OBSERVERS.append(observer)
    return lambda: _OBSERVERS.remove(observer)


class _Watch:
    """The observers' tickets for one call (empty, and nearly free, when nobody observes)."""

    __slots__ = ("tickets",)

    def __init__(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> None:
        self.tickets = [(o, o.sent(name, keys, args)) for o in _OBSERVERS]

    def answered(self, reply: Any) -> None:
        for observer, ticket in self.tickets:
            observer.answered(ticket, reply)

    def unanswered(self, error: BaseException) -> None:
        for observer, ticket in self.tickets:
            observer.unanswered(ticket, error)


def _lua_literal(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_lua_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "{" + ", ".join(_lua_literal(v) for v in value) + "}"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _limits_table(script: str) -> str:
    """``LIMITS`` with the entries of each table of limits.json (bounds, defaults, run
    states) that the script names (built on every call, so small)."""
    words = set(re.findall(r"[A-Za-z_]+", script))
    data = {
        part: {name: value for name, value in entries.items() if name in words}
        for part, entries in table().items()
        if isinstance(entries, dict)
    }
    return f"local LIMITS = {_lua_literal(data)}"


_LIMITS_MARK = "-- @limits"


def _expand(text: str, seen: set[str]) -> str:
    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return ""
        seen.add(name)
        if name == "limits.json":
            return _LIMITS_MARK
        return _expand((lua_dir() / "include" / name).read_text(), seen)

    return _INCLUDE.sub(include, text)


@cache
def source(name: str) -> str:
    """The script's text with its includes expanded."""
    text = _expand((lua_dir() / f"{name}.lua").read_text(), set())
    return text.replace(_LIMITS_MARK, _limits_table(text), 1)


class Call(NamedTuple):
    """One script call, to send with others in :meth:`Scripts.many`."""

    name: str
    keys: list[str]
    args: Sequence[Any]


class Command(NamedTuple):
    """A plain Redis command to send with script calls in :meth:`Scripts.many` (raw reply)."""

    args: tuple[Any, ...]


class _Registered(dict[str, Script]):
    """The scripts of :data:`KEY_COUNTS` registered on one client, each when first used
    (its file read then: a command that reads no script reads no Lua file)."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__()
        self.client = client

    def __missing__(self, name: str) -> Script:
        if name not in KEY_COUNTS:
            raise KeyError(name)
        script = self[name] = self.client.register_script(source(name))
        return script


class Scripts:
    """Every script registered on one client (``register_script`` reloads on NOSCRIPT),
    each when first used."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._scripts = _Registered(client)

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]

    def run(self, name: str, keys: list[str], args: Sequence[Any], client: Any = None) -> Any:
        """Runs a script and returns its raw reply; ``client`` may be a pipeline to queue it."""
        return self._scripts[name](keys=keys, args=args, client=client)

    def call(self, name: str, keys: list[str], args: Sequence[Any]) -> Any:
        """Runs a script and returns its decoded reply (see :mod:`redis_lease.protocol.replies`).

        A script the server lost is loaded again, and the call is sent again, up
        to ``NOSCRIPT_RETRIES`` times: a storm of ``SCRIPT FLUSH`` costs reloads.
        """
        if not _OBSERVERS:
            return DECODERS[name](self._evalsha(name, keys, args))
        watch = _Watch(name, keys, args)
        try:
            reply = DECODERS[name](self._evalsha(name, keys, args))
        except redis.ResponseError as error:
            watch.answered(error)
            raise
        except BaseException as error:
            watch.unanswered(error)
            raise
        watch.answered(reply)
        return reply

    def call_waited(
        self, name: str, keys: list[str], args: Sequence[Any], replicas: int, timeout_ms: int
    ) -> tuple[Any, int]:
        """Runs a script, then ``WAIT replicas timeout_ms`` on the same connection, in one
        round trip; returns its decoded reply and the replicas that acknowledged it in time.

        WAIT counts the writes of its own connection only, so both go in one pipeline: on
        a cluster, to the primary that serves the keys' slot (its replicas are the ones
        that count), reading the slots again when that node answers MOVED or ASK. A script
        the server lost is loaded again, as in :meth:`call`. A reply fewer than
        ``replicas`` acknowledged is the caller's to hold back: the observers hear of it as
        unanswered (NotReplicated), its outcome unknown to the caller.

        Raises:
            redis.ResponseError: the script refused the call (its only writes are refusal
                counters: no replica is waited for).
        """
        watch = _Watch(name, keys, args) if _OBSERVERS else None
        try:
            raw, acked = self._evalsha_waited(name, keys, args, replicas, timeout_ms)
            reply = raw if isinstance(raw, redis.ResponseError) else DECODERS[name](raw)
        except BaseException as error:
            if watch is not None:
                watch.unanswered(error)
            raise
        if isinstance(reply, redis.ResponseError):
            if watch is not None:
                watch.answered(reply)
            raise reply
        acked = int(acked)
        if watch is not None:
            if acked < replicas:
                text = f"{acked} of {replicas} replicas acknowledged within {timeout_ms} ms"
                watch.unanswered(NotReplicated(text, wanted=replicas, acked=acked))
            else:
                watch.answered(reply)
        return reply, acked

    def _evalsha_waited(
        self, name: str, keys: list[str], args: Sequence[Any], replicas: int, timeout_ms: int
    ) -> tuple[Any, Any]:
        """The script's raw reply (or its error reply) and WAIT's, sent together.

        A WAIT the server refuses (an ACL without ``wait``) raises its error: what the
        script granted is then handed to nobody, and runs out by its expiry.
        """
        script = self._scripts[name]
        for attempt in range(NOSCRIPT_RETRIES + 1):
            client = self._serving(keys[0])
            pipe = client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", replicas, timeout_ms)  # type: ignore[no-untyped-call]
            raw, acked = pipe.execute(raise_on_error=False)
            last = attempt == NOSCRIPT_RETRIES
            if isinstance(raw, NoScriptError) and not last:
                client.script_load(script.script)
                continue
            moved = isinstance(raw, (MovedError, AskError))
            if moved and isinstance(self.client, RedisCluster) and not last:
                self.client.nodes_manager.initialize()  # the slot moved: read the slots again
                continue
            if isinstance(acked, Exception) and not isinstance(raw, redis.ResponseError):
                raise acked  # WAIT itself refused (an ACL without it): not a reply to hand out
            return raw, acked
        raise AssertionError("unreachable")  # pragma: no cover

    def _serving(self, key: str) -> redis.Redis:
        """The client whose connection runs a call on ``key``: the store's, or on a cluster
        the client of the primary that serves the key's slot."""
        if isinstance(self.client, RedisCluster):
            node_client: redis.Redis = self.client.get_node_from_key(key).redis_connection
            return node_client
        return self.client

    def _evalsha(self, name: str, keys: list[str], args: Sequence[Any]) -> Any:
        # redis-py's Script reloads once on NOSCRIPT; a flush between its reload and
        # its retry would still fail the call, so the whole call is tried again.
        for attempt in range(NOSCRIPT_RETRIES + 1):
            try:
                return self._scripts[name](keys=keys, args=args)
            except NoScriptError:
                if attempt == NOSCRIPT_RETRIES:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def many(self, calls: Sequence[Call | Command]) -> list[Any]:
        """Runs the calls in one pipeline; per call, its decoded reply or its ResponseError.

        A :class:`Command` rides along in the same round trip; its reply is redis-py's.

        Scripts go out as plain ``EVALSHA`` (no ``SCRIPT EXISTS`` first); calls that meet
        NOSCRIPT (a new server, or the scripts were flushed) are loaded and sent again, up
        to ``NOSCRIPT_RETRIES`` times, so a ``SCRIPT FLUSH`` costs a reload, never an error.
        Connection errors raise.
        """
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        # One operation per call for the observers, however often NOSCRIPT sends it again
        # (a call refused with NOSCRIPT did not run).
        watches: dict[int, _Watch] = {}
        if _OBSERVERS:
            for index, call in enumerate(calls):
                if isinstance(call, Call):
                    watches[index] = _Watch(call.name, call.keys, call.args)
        for attempt in range(NOSCRIPT_RETRIES + 1):
            pipe = self.client.pipeline(transaction=False)
            for index in todo:
                call = calls[index]
                if isinstance(call, Command):
                    pipe.execute_command(*call.args)  # type: ignore[no-untyped-call]
                else:
                    sha = self._scripts[call.name].sha
                    pipe.evalsha(sha, len(call.keys), *call.keys, *call.args)
            try:
                answers = pipe.execute(raise_on_error=False) if todo else []
            except BaseException as error:
                for index in todo:
                    if index in watches:
                        watches[index].unanswered(error)
                raise
            # An error that is not the server's reply: a cluster client gave up on a call
            # (TTL exhausted), so whether the others ran is the caller's unknown too.
            gave_up = next(
                (
                    a
                    for a in answers
                    if isinstance(a, Exception) and not isinstance(a, redis.ResponseError)
                ),
                None,
            )
            if gave_up is not None:
                for index in todo:
                    if index in watches:
                        watches[index].unanswered(gave_up)
                raise gave_up
            retry: list[int] = []
            missing: set[str] = set()
            for index, answer in zip(todo, answers, strict=True):
                call = calls[index]
                if (
                    isinstance(call, Call)
                    and isinstance(answer, NoScriptError)
                    and (attempt < NOSCRIPT_RETRIES)
                ):
                    retry.append(index)
                    missing.add(call.name)
                    continue
                if isinstance(answer, redis.ResponseError) or isinstance(call, Command):
                    replies[index] = answer
                else:
                    replies[index] = DECODERS[call.name](answer)
                if index in watches:
                    watches[index].answered(replies[index])
            if not retry:
                break
            for name in sorted(missing):
                self.client.script_load(self._scripts[name].script)
            todo = retry
        return replies
