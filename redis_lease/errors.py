"""The exception hierarchy: one root, one class per script error.

Every error carries the run, item and token it is about (``None`` where it does
not apply). Script error replies are translated into these classes at one
place, :func:`from_reply`.
"""

from __future__ import annotations

from typing import Any

import redis


class LeaseError(Exception):
    """Root of every error raised by redis-lease."""

    #: The CLI exit code for this kind of error.
    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        item_id: str | None = None,
        token: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.run_id = run_id
        self.item_id = item_id
        self.token = token


class InvalidInput(LeaseError, ValueError):
    """An id, payload, TTL or option is not acceptable; nothing was written."""

    exit_code = 2


class LeaseLost(LeaseError):
    """The caller no longer holds the lease: stale token, other lease id, or expired."""

    exit_code = 3

    def __init__(self, message: str, *, current_token: int | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.current_token = current_token


class NotClaimable(LeaseError):
    """The item is held by another lease, not yet due, finished, or nothing is due."""

    exit_code = 4

    def __init__(
        self,
        message: str,
        *,
        state: str | None = None,
        until_ms: int | None = None,
        **context: Any,
    ) -> None:
        super().__init__(message, **context)
        self.state = state
        self.until_ms = until_ms


class NotFound(LeaseError):
    """The run or item does not exist."""

    exit_code = 5


class RunClosed(LeaseError):
    """The run is closed to claims and new items until an operator resumes it."""

    exit_code = 4


class ConditionFailed(LeaseError):
    """A guarded commit's condition did not hold; nothing was committed or written."""

    exit_code = 3

    def __init__(self, message: str, *, condition: int, **context: Any) -> None:
        super().__init__(message, **context)
        #: The 1-based number of the first condition that failed.
        self.condition = condition


class RedisUnavailable(LeaseError):
    """Redis could not be reached or refused the connection (auth, TLS, timeout)."""

    exit_code = 6


def _fields(detail: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in detail.split() if "=" in part)


def from_reply(
    error: redis.ResponseError,
    *,
    run_id: str | None = None,
    item_id: str | None = None,
    token: int | None = None,
) -> LeaseError:
    """Translates a script's error reply (``CODE key=value ...``) into a LeaseError."""
    code, _, detail = str(error).partition(" ")
    fields = _fields(detail)
    context: dict[str, Any] = {"run_id": run_id, "item_id": item_id, "token": token}
    item = fields.get("item", item_id)
    if code == "LEASE_LOST":
        current = int(fields.get("current_token", "0"))
        return LeaseLost(
            f"lease lost on item {item!r} of run {run_id!r}: token {token} is not the current "
            f"lease (current token {current}, state {fields.get('state')}); stop and do not commit",
            current_token=current,
            **context,
        )
    if code == "NOT_CLAIMABLE":
        until = int(fields.get("until", "0")) or None
        state = fields.get("state")
        when = f" until {_iso(until)}" if until else ""
        return NotClaimable(
            f"item {item!r} of run {run_id!r} is not claimable: {state}{when}",
            state=state,
            until_ms=until,
            **context,
        )
    if code == "NOT_FOUND":
        return NotFound(f"item {item!r} not found in run {run_id!r}; add it first", **context)
    if code == "RUN_CLOSED":
        return RunClosed(
            f"run {run_id!r} is closed; resume it with 'redis-lease resume {run_id}'", **context
        )
    if code == "CONDITION_FAILED":
        number = int(fields.get("condition", "0"))
        return ConditionFailed(
            f"guard condition {number} failed for item {item!r}; nothing was committed",
            condition=number,
            **context,
        )
    if code == "INVALID":
        return InvalidInput(f"invalid request: {detail}", **context)
    return LeaseError(f"unexpected reply from Redis: {error}", **context)


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
