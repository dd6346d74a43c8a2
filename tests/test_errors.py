"""Errors that never mislead: one root, what each error is about, plain words.

Every error class the library defines is a :class:`RedisLeaseError`, reachable
from ``redis_lease`` and from its old import path; a lost lease says what
happened to the item; a run error names the run; everything Redis answers is
translated at one place (:func:`redis_lease.protocol.connection.translate.translate`).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import pkgutil
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

import redis_lease
from redis_lease import (
    EffectFailed,
    HandlerError,
    InvalidInput,
    Item,
    LeaseError,
    LeaseLost,
    LeaseStore,
    NeedsReconciliation,
    NotFound,
    PermanentError,
    PermissionDenied,
    RedisLeaseError,
    RedisUnavailable,
    RunClosed,
    SlotTimeout,
    Throttled,
    TLSFailed,
)
from redis_lease.cli import report
from redis_lease.fleet.effects.ledger import apply_effect
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.limits import DELAY_MAX_MS
from redis_lease.protocol.connection.translate import translate, translating_errors
from redis_lease.protocol.error_replies import from_reply
from tests.helpers import wait_past


def defined_exceptions() -> list[type[BaseException]]:
    """Every exception class defined in a module of the package (warnings aside)."""
    found = []
    for info in pkgutil.walk_packages(redis_lease.__path__, "redis_lease."):
        if info.name.endswith("__main__"):  # runs the command line when imported
            continue
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(value, BaseException)
                and not issubclass(value, Warning)
                and value.__module__ == info.name
                and not value.__name__.startswith("_")  # a module's own signal, caught there
            ):
                found.append(value)
    return found


# -- one root ----------------------------------------------------------------------------


def test_every_error_the_library_defines_is_under_the_root() -> None:
    classes = defined_exceptions()
    assert {EffectFailed, PermanentError, SlotTimeout, PermissionDenied} <= set(classes)
    for cls in classes:
        assert issubclass(cls, RedisLeaseError), cls
        doc = (cls.__doc__ or "").strip()
        assert doc and doc.splitlines()[0].endswith("."), f"{cls.__name__} needs a docstring"


def test_every_error_is_exported_from_the_package() -> None:
    for cls in defined_exceptions():
        assert getattr(redis_lease, cls.__name__) is cls
        assert cls.__name__ in redis_lease.__all__
    assert "ProviderGate" in redis_lease.__all__


def test_the_groups_and_their_exit_codes() -> None:
    assert issubclass(LeaseLost, LeaseError) and issubclass(LeaseError, RedisLeaseError)
    for handler_error in (PermanentError, NeedsReconciliation, EffectFailed, Throttled):
        assert issubclass(handler_error, HandlerError) and not issubclass(handler_error, LeaseError)
    assert issubclass(SlotTimeout, HandlerError)
    assert PermissionDenied.exit_code == TLSFailed.exit_code == RedisUnavailable.exit_code == 6
    assert HandlerError.exit_code == 1
    assert PermanentError().message == "", "a handler may raise it without a message"


@pytest.mark.parametrize(
    ("retry_after", "delay_ms"),
    [(0.25, 250), (3 * 86400, DELAY_MAX_MS), (math.inf, DELAY_MAX_MS), (-math.inf, 0),
     (-5, 0), (math.nan, 1000), ("soon", 1000)],
)  # fmt: skip
def test_a_throttle_delay_is_clamped_to_the_protocol_bound(retry_after: Any, delay_ms: int) -> None:
    assert Throttled("429", retry_after=retry_after).delay_ms == delay_ms


# -- lost leases in plain words ----------------------------------------------------------

EXPIRES = 1796263200000  # 2026-12-03T02:00:00Z


def lost(detail: str, token: int | None = 2) -> LeaseLost:
    error = from_reply(redis.ResponseError(f"LEASE_LOST {detail}"), run_id="r", token=token)
    assert isinstance(error, LeaseLost)
    return error


@pytest.mark.parametrize(
    ("detail", "why", "reason"),
    [
        ("state=pending reason=state current_token=2",
         "it is pending now (released, failed or expired)", "state"),
        ("state=done reason=state current_token=2", "it is done", "state"),
        ("state=dead reason=state current_token=2", "it is dead", "state"),
        ("state=leased reason=token current_token=3", "token 3 holds it now", "token"),
        ("state=leased reason=lease current_token=2", "another lease holds it now", "lease"),
        (f"state=leased reason=expired current_token=2 expires_at={EXPIRES}",
         "its lease expired at 2026-12-03T02:00:00.000+00:00", "expired"),
        # Replies of scripts that predate reason= and expires_at=:
        ("state=pending current_token=2", "it is pending now", None),
        ("current_token=4", "token 4 holds it now", None),
        ("state=leased current_token=2", "its lease expired or another lease holds it", None),
    ],
)  # fmt: skip
def test_lease_lost_says_what_happened(detail: str, why: str, reason: str | None) -> None:
    error = lost(f"item=a token=2 {detail}")
    assert error.message.startswith(
        f"lease lost: item 'a' of run 'r' is no longer leased by token 2: {why}"
    ), error.message
    assert error.message.endswith("; stop and do not commit")
    assert "not the current lease" not in error.message
    assert (error.reason, error.run_id, error.item_id, error.token) == (reason, "r", "a", 2)
    assert error.exit_code == 3


def test_lease_lost_carries_the_reply_fields() -> None:
    error = lost(f"item=a token=2 current_token=2 state=leased reason=expired expires_at={EXPIRES}")
    assert (error.state, error.current_token, error.expires_at_ms) == ("leased", 2, EXPIRES)
    no_token = lost("item=a token=7 current_token=8 state=leased reason=token", token=None)
    assert no_token.token == 7, "the reply's token when the caller gave none"


def test_a_repeated_release_says_the_item_is_pending(store: LeaseStore) -> None:
    store.add("r", [Item("a")])
    lease = store.claim("r", "a", "w")
    store.release(lease)
    with pytest.raises(LeaseLost) as info:
        store.release(lease)
    message = info.value.message
    assert "no longer leased by token 1: it is pending now" in message, message
    assert "current token" not in message and "not the current lease" not in message
    assert (info.value.reason, info.value.state) == ("state", "pending")


def test_a_taken_over_lease_names_the_new_token(store: LeaseStore) -> None:
    store.add("r", [Item("a")])
    first = store.claim("r", "a", "w1", ttl=0.05)
    wait_past(store.client, first.expires_at_ms)
    with pytest.raises(LeaseLost) as expired:
        store.commit(first)
    assert expired.value.reason == "expired" and expired.value.expires_at_ms == first.expires_at_ms
    when = datetime.fromtimestamp(first.expires_at_ms / 1000, UTC)
    assert f"its lease expired at {when.isoformat(timespec='milliseconds')}" in str(expired.value)
    second = store.claim("r", "a", "w2")
    with pytest.raises(LeaseLost) as taken:
        store.renew(first)
    assert taken.value.reason == "token" and "token 2 holds it now" in str(taken.value)
    with pytest.raises(LeaseLost) as other_lease:
        store.commit(replace(second, lease_id="other"))
    assert other_lease.value.reason == "lease"
    assert "another lease holds it now with the same token" in str(other_lease.value)
    store.commit(second)
    with pytest.raises(LeaseLost) as done:
        store.renew(second)
    assert done.value.state == "done" and "it is done" in str(done.value)


# -- runs --------------------------------------------------------------------------------


def test_a_closed_run_says_why(store: LeaseStore) -> None:
    store.add("r", [Item("a"), Item("b")])
    store.set_closed("r", True)
    with pytest.raises(RunClosed) as closed:
        store.claim("r", "a", "w")
    assert closed.value.reason == "closed" and closed.value.run_id == "r"
    assert "run 'r' is closed; resume it with 'redis-lease resume r'" in str(closed.value)
    store.set_closed("r", False)
    store.set_deadline("r", EXPIRES - 86_400_000 * 365)  # long past
    with pytest.raises(RunClosed) as late:
        store.claim("r", "b", "w")
    assert (late.value.reason, late.value.deadline_ms) == ("deadline", EXPIRES - 86_400_000 * 365)
    assert "passed its deadline at 2025-12-03T02:00:00.000+00:00" in str(late.value)


def test_a_missing_run_is_named_as_a_run(store: LeaseStore) -> None:
    with pytest.raises(NotFound) as info:
        Runs(store).transition("gone:2026-12-02", "running", "succeeded", "all done")
    assert info.value.run_id == "gone:2026-12-02" and info.value.item_id is None
    assert str(info.value).startswith("run 'gone:2026-12-02' not found")
    assert "None" not in str(info.value)


def test_effect_and_handler_errors_carry_their_item(store: LeaseStore) -> None:
    store.add("r", [Item("a")])
    lease = store.claim("r", "a", "w")
    key = "r|a|pay"
    store.record_effect(lease, key, "pay", "intended")
    with pytest.raises(NeedsReconciliation) as info:
        apply_effect(store, lease, "pay", lambda key: None)
    assert (info.value.run_id, info.value.item_id, info.value.token) == ("r", "a", 1)


# -- one translation ---------------------------------------------------------------------

URL = "redis://:s3cret@127.0.0.1:6399/0"


def test_translate_sorts_every_failure() -> None:
    context = {"run_id": "r", "item_id": "a", "token": 3}
    refused = translate(URL, redis.ConnectionError("Error 111 connecting"), **context)
    assert isinstance(refused, RedisUnavailable) and refused.item_id == "a"
    assert "s3cret" not in str(refused) and "127.0.0.1:6399" in str(refused)
    assert isinstance(translate(URL, redis.TimeoutError("Timeout reading")), RedisUnavailable)
    assert isinstance(translate(URL, OSError("reset")), RedisUnavailable)
    reply = translate(URL, redis.ResponseError("NOT_FOUND item=a"), **context)
    assert isinstance(reply, NotFound) and reply.token == 3
    odd = translate(URL, redis.ResponseError("BUSYGROUP something odd"), **context)
    assert type(odd) is LeaseError and odd.run_id == "r"
    assert str(odd) == "unexpected reply from Redis at redis://:***@127.0.0.1:6399/0: " + (
        "BUSYGROUP something odd"
    )
    denied = redis.exceptions.NoPermissionError(
        "this user has no permissions to run the 'hset' command"
    )
    assert isinstance(translate(URL, denied), PermissionDenied)


def test_one_door_translates_a_block_and_a_pipeline_reply() -> None:
    context = {"run_id": "r", "item_id": "a", "token": 3}
    door = translating_errors(URL, **context)
    with pytest.raises(RunClosed) as raised, door:
        raise redis.ResponseError("RUN_CLOSED reason=closed")
    assert raised.value.__suppress_context__ and raised.value.token == 3
    reply = door.error(redis.ResponseError("RUN_CLOSED reason=closed"))
    assert (
        str(reply)
        == str(raised.value)
        == "run 'r' is closed; resume it with " + ("'redis-lease resume r'")
    )
    with pytest.raises(RedisUnavailable, match="unreachable"), door:
        raise OSError("reset")
    own = InvalidInput("not this library's Redis")
    with pytest.raises(InvalidInput) as passed, door:
        raise own
    assert passed.value is own


def test_every_call_path_goes_through_the_one_door() -> None:
    """Only the door (translate.py) calls :func:`translate` or reads script replies."""
    package = Path(redis_lease.__file__).parent
    door = package / "protocol" / "connection" / "translate.py"
    callers = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            called = node.func if isinstance(node, ast.Call) else None
            name = getattr(called, "id", getattr(called, "attr", None))
            if {"translate", "from_reply"} & {*names, name} and path != door:
                callers.append(f"{path.relative_to(package)}:{node.lineno}")
    assert callers == [], "use translating_errors()"


def test_the_cli_reports_every_error_of_the_root(capsys: pytest.CaptureFixture[str]) -> None:
    assert report(PermanentError("no such account")) == 1
    assert capsys.readouterr().err == "error: no such account\n"
    assert report(redis.ConnectionError("Error 111 connecting to 127.0.0.1:1.")) == 6
    assert "unreachable" in capsys.readouterr().err
