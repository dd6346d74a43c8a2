"""The exception hierarchy: one root, a few groups, one class per kind of failure.

::

    RedisLeaseError                  every error redis-lease raises
    ├── LeaseError                   the lease protocol and its server
    │   ├── InvalidInput             exit 2
    │   ├── LeaseLost                exit 3
    │   ├── ConditionFailed          exit 3
    │   ├── NotClaimable             exit 4
    │   ├── RunClosed                exit 4
    │   ├── NotFound                 exit 5
    │   ├── RedisUnavailable         exit 6
    │   │   ├── PermissionDenied
    │   │   ├── TLSFailed
    │   │   └── ClusterBusy
    │   └── ProtocolMismatch         exit 9
    └── HandlerError                 raised by a job's handler and the effects it applies
        ├── PermanentError
        │   └── NeedsReconciliation
        └── ProviderError
            ├── EffectFailed
            │   └── Throttled
            ├── EffectUnknown
            └── SlotTimeout

Every error carries the run, item and token it is about (``None`` where it does
not apply). Script error replies are translated into these classes at one
place, :func:`from_reply`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import redis

from .limits import DELAY_MAX_MS

#: The script error codes :func:`from_reply` translates (lua/*.lua headers).
SCRIPT_CODES = frozenset(
    {"LEASE_LOST", "NOT_CLAIMABLE", "NOT_FOUND", "RUN_CLOSED", "CONDITION_FAILED", "INVALID"}
)


class RedisLeaseError(Exception):
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


# -- the lease protocol ---------------------------------------------------------------------


class LeaseError(RedisLeaseError):
    """Root of the lease and protocol errors: input, leases, runs and the Redis server."""


class InvalidInput(LeaseError, ValueError):
    """An id, payload, TTL, URL or option is not acceptable; nothing was written."""

    exit_code = 2


class LeaseLost(LeaseError):
    """The caller no longer holds the lease: released, failed, expired or taken over.

    Attributes:
        current_token: the item's token now.
        reason: ``state`` (not leased now), ``token`` (a newer token holds it),
            ``lease`` (same token, another lease id) or ``expired``; None when
            the server did not say.
        state: the item's state now (pending, leased, done, dead).
        expires_at_ms: when the lease expired (server clock), for ``expired``.
    """

    exit_code = 3

    def __init__(
        self,
        message: str,
        *,
        current_token: int | None = None,
        reason: str | None = None,
        state: str | None = None,
        expires_at_ms: int | None = None,
        **context: Any,
    ) -> None:
        super().__init__(message, **context)
        self.current_token = current_token
        self.reason = reason
        self.state = state
        self.expires_at_ms = expires_at_ms


class NotClaimable(LeaseError):
    """The item is held by another lease, not yet due, finished, or nothing is due.

    Attributes:
        state: the item's state (pending, leased, done, dead); None when no item was
            named and nothing is due in any shard
            (:meth:`~redis_lease.store.LeaseStore.claim_any`).
        until_ms: when the item is due or its lease expires (server clock), when known.
    """

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
    """The run grants no lease: it was closed, or its deadline passed.

    Attributes:
        reason: ``closed`` or ``deadline``; None when the server did not say.
        deadline_ms: the deadline that passed (server clock), for ``deadline``.
    """

    exit_code = 4

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        deadline_ms: int | None = None,
        **context: Any,
    ) -> None:
        super().__init__(message, **context)
        self.reason = reason
        self.deadline_ms = deadline_ms


class ConditionFailed(LeaseError):
    """A guarded commit's condition did not hold; nothing was committed or written."""

    exit_code = 3

    def __init__(self, message: str, *, condition: int, **context: Any) -> None:
        super().__init__(message, **context)
        #: The 1-based number of the first condition that failed.
        self.condition = condition


class RedisUnavailable(LeaseError):
    """Redis could not be reached or refused the connection (login, TLS, timeout)."""

    exit_code = 6


class PermissionDenied(RedisUnavailable):
    """The server's ACL refuses the Redis user a command or key (``NOPERM``).

    Attributes:
        command: the refused command (e.g. ``TIME``), or None when the server did not say.
    """

    def __init__(self, message: str, *, command: str | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.command = command


class ClusterBusy(RedisUnavailable):
    """A Redis Cluster refused a call while moving or missing hash slots, before running it.

    ``TRYAGAIN``, ``CLUSTERDOWN``, or redirections past the client's bound. Like any
    call retried after a timeout, an earlier attempt may have run: the outcome is
    unknown only then, and the fence handles it as for any unanswered call.
    """


class TLSFailed(RedisUnavailable, redis.RedisError):
    """The TLS handshake failed: the server does not speak TLS, or a CA, certificate or key.

    Also a ``redis.RedisError`` (not a ``ConnectionError``), so that redis-py
    neither retries it nor hides it behind a generic connection error.
    """


class ProtocolMismatch(LeaseError):
    """The data in Redis is in a protocol this release does not speak; nothing was written.

    Attributes:
        found: the stamp as read (``<prefix>:protocol``, see
            :mod:`redis_lease.protocol.store.stamp`).
        speaks: the protocol numbers this release speaks.
    """

    exit_code = 9

    def __init__(
        self, message: str, *, found: str, speaks: tuple[int, ...], **context: Any
    ) -> None:
        super().__init__(message, **context)
        self.found = found
        self.speaks = speaks


# -- handlers and effects -------------------------------------------------------------------


class HandlerError(RedisLeaseError):
    """Raised by a job's handler (or the effects it applies) to say how its item ends."""

    def __init__(self, message: str = "", **context: Any) -> None:
        super().__init__(message, **context)


class PermanentError(HandlerError):
    """Raised by a handler for a failure that no retry can mend: the item goes dead."""


class NeedsReconciliation(PermanentError):
    """An earlier attempt's outcome is unknown and the provider can neither dedupe nor be asked."""


class ProviderError(HandlerError):
    """The provider boundary: an effect's call or its slot did not go through."""


class EffectFailed(ProviderError):
    """The provider answered definitely that it did not apply the effect."""


class Throttled(EffectFailed):
    """The provider refused for load (HTTP 429 or alike); retry after ``retry_after`` seconds.

    The item is released, not failed, and is due again after :attr:`delay_ms`.
    """

    #: Seconds waited when ``retry_after`` is not a number.
    DEFAULT_RETRY_AFTER = 1.0

    def __init__(
        self, message: str = "", retry_after: float = DEFAULT_RETRY_AFTER, **context: Any
    ) -> None:
        super().__init__(message, **context)
        self.retry_after = retry_after

    @property
    def delay_ms(self) -> int:
        """``retry_after`` in whole ms, clamped to the protocol's delay bound (never inf or nan)."""
        try:
            ms = float(self.retry_after) * 1000
        except (TypeError, ValueError, OverflowError):
            ms = math.nan
        if math.isnan(ms):
            ms = self.DEFAULT_RETRY_AFTER * 1000
        return int(min(max(ms, 0.0), DELAY_MAX_MS))


class EffectUnknown(ProviderError):
    """The call may or may not have been applied (timeout, reset, 5xx after sending)."""


class SlotTimeout(ProviderError):
    """No provider slot became free in time; the item is released and retried later."""


# -- script replies -------------------------------------------------------------------------


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
