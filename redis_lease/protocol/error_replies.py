"""A script's error reply (``CODE key=value ...``, the codes of the lua/*.lua headers)
read into this library's error: :func:`from_reply`, with the messages operators see.

:mod:`redis_lease.protocol.connection.translate` calls it for every script error reply
that reaches the library; the error classes are :mod:`redis_lease.errors`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import redis

from ..errors import (
    ConditionFailed,
    InvalidInput,
    LeaseError,
    LeaseLost,
    NotClaimable,
    NotFound,
    RunClosed,
)

#: The script error codes :func:`from_reply` translates (lua/*.lua headers).
SCRIPT_CODES = frozenset(
    {"LEASE_LOST", "NOT_CLAIMABLE", "NOT_FOUND", "RUN_CLOSED", "CONDITION_FAILED", "INVALID"}
)


def _fields(detail: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in detail.split() if "=" in part)


def _int(fields: dict[str, str], name: str) -> int | None:
    """A whole-number field of a reply, None when absent, empty or zero."""
    try:
        return int(fields.get(name, "")) or None
    except ValueError:
        return None


def iso(ms: int) -> str:
    """A server time in ms as ISO 8601 UTC with milliseconds."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _about(item: str | None, run: str | None) -> str:
    """``item 'a' of run 'r'`` (parts that are unknown are left out)."""
    if item is None:
        return f"run {run!r}"
    return f"item {item!r} of run {run!r}" if run is not None else f"item {item!r}"


#: What each state means to a holder that lost its lease.
_NOW = {
    "pending": "it is pending now (released, failed or expired)",
    "done": "it is done",
    "dead": "it is dead (out of attempts or failed for good)",
}


def _lost_why(
    reason: str | None, state: str | None, token: int | None, current: int, expires: int | None
) -> str:
    """Why a lease is lost, in plain words; for an older script's reply it is inferred."""
    if reason is None:
        if state not in (None, "leased"):
            reason = "state"
        elif current and current != token:
            reason = "token"
        else:
            return "its lease expired or another lease holds it"
    if reason == "state":
        return _NOW.get(state or "", f"it is {state} now")
    if reason == "token":
        return f"token {current} holds it now"
    if reason == "lease":
        return "another lease holds it now with the same token"
    return f"its lease expired at {iso(expires)}" if expires else "its lease expired"


def _lease_lost(fields: dict[str, str], item: str | None, context: dict[str, Any]) -> LeaseLost:
    token = context["token"] if context["token"] is not None else _int(fields, "token")
    current, expires = _int(fields, "current_token") or 0, _int(fields, "expires_at")
    reason, state = fields.get("reason"), fields.get("state")
    why = _lost_why(reason, state, token, current, expires)
    return LeaseLost(
        f"lease lost: {_about(item, context['run_id'])} is no longer leased by token {token}: "
        f"{why}; stop and do not commit",
        current_token=current,
        reason=reason,
        state=state,
        expires_at_ms=expires,
        **{**context, "token": token, "item_id": item},
    )


def _run_closed(fields: dict[str, str], run: str | None, context: dict[str, Any]) -> RunClosed:
    reason, deadline = fields.get("reason"), _int(fields, "deadline")
    if reason == "deadline":
        when = f" at {iso(deadline)}" if deadline else ""
        message = (
            f"run {run!r} passed its deadline{when}: no new lease is granted; "
            f"extend it with 'redis-lease resume {run} --deadline 2h'"
        )
    else:
        message = f"run {run!r} is closed; resume it with 'redis-lease resume {run}'"
    return RunClosed(message, reason=reason, deadline_ms=deadline, **{**context, "run_id": run})


def from_reply(
    error: redis.ResponseError,
    *,
    run_id: str | None = None,
    item_id: str | None = None,
    token: int | None = None,
) -> LeaseError:
    """Translates a script's error reply (``CODE key=value ...``) into a LeaseError.

    Replies with fields this version does not know, or without fields that
    older scripts did not send (``reason``, ``expires_at``), translate too.
    """
    code, _, detail = str(error).partition(" ")
    fields = _fields(detail)
    context: dict[str, Any] = {"run_id": run_id, "item_id": item_id, "token": token}
    item = fields.get("item", item_id)
    run = run_id if run_id is not None else fields.get("run")
    if code == "LEASE_LOST":
        return _lease_lost(fields, item, context)
    if code == "NOT_CLAIMABLE":
        until, state = _int(fields, "until"), fields.get("state")
        when = f" until {iso(until)}" if until else ""
        return NotClaimable(
            f"{_about(item, run_id)} is not claimable: {state}{when}",
            state=state,
            until_ms=until,
            **context,
        )
    if code == "NOT_FOUND":
        if "item" not in fields and "run" in fields:
            return NotFound(
                f"run {run!r} not found; check the run id ('redis-lease status' lists runs)",
                **{**context, "run_id": run},
            )
        return NotFound(f"{_about(item, run_id)} not found; add it first", **context)
    if code == "RUN_CLOSED":
        return _run_closed(fields, run, context)
    if code == "CONDITION_FAILED":
        number = int(fields.get("condition", "0"))
        return ConditionFailed(
            f"guard condition {number} failed for {_about(item, run_id)}; nothing was committed",
            condition=number,
            **context,
        )
    if code == "INVALID":
        return InvalidInput(f"invalid request: {detail}", **context)
    return LeaseError(f"unexpected reply from Redis: {error}", **context)
