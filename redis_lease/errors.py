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
    │   │   ├── ClusterBusy
    │   │   └── NotReplicated
    │   └── ProtocolMismatch         exit 9
    ├── MissingExtra                 exit 10
    └── HandlerError                 raised by a job's handler and the effects it applies
        ├── PermanentError
        │   └── NeedsReconciliation
        └── ProviderError
            ├── EffectFailed
            │   └── Throttled
            ├── EffectUnknown
            └── SlotTimeout

Every error carries the run, item and token it is about (``None`` where it does
not apply). What Redis raises and the scripts' error replies become these classes
in the protocol layer (:mod:`redis_lease.protocol.connection.translate`, which reads a
script's reply with :func:`redis_lease.protocol.error_replies.from_reply`).
"""

from __future__ import annotations

import math
from typing import Any

import redis

from .limits import DELAY_MAX_MS


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
            (:meth:`~redis_lease.LeaseStore.claim_any`).
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

    @classmethod
    def run(cls, run_id: str, *, then: str = "") -> NotFound:
        """The error for an unknown run: it points at the command listing the runs.

        ``then``: what else may help, after a ``;`` (e.g. ``add items to create it``).
        """
        tail = f"; {then}" if then else ""
        return cls(
            f"run {run_id!r} not found (`redis-lease runs` lists the runs){tail}", run_id=run_id
        )


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


class RedisFull(RedisUnavailable):
    """Redis is full: its used memory is over ``maxmemory`` and its policy evicts nothing.

    The server refused the call before running it (``OOM``). Free memory, raise
    ``maxmemory``, or finish or delete old runs. A worker rides it out as it does a stall:
    a refused claim is tried again, a refused commit is sent again while its lease holds.
    """

    exit_code = 13


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


class NotReplicated(RedisUnavailable):
    """Too few replicas acknowledged a claim or an effect's intent in time: not handed out.

    The store waits for ``wait_replicas`` replicas, ``wait_timeout_ms`` at most; fewer had
    the write by then, so it may be on the primary only. A claim so refused was not
    granted: its leases were given back (or, when that failed too, they run out by their
    expiry), and no caller saw their tokens. An intent so refused is marked failed, not
    sent (or, when that fails too, left for the next attempt to reconcile), and its effect
    was not sent.

    Attributes:
        wanted: the replicas the store waits for.
        acked: the replicas that acknowledged in time.
    """

    def __init__(self, message: str, *, wanted: int, acked: int, **context: Any) -> None:
        super().__init__(message, **context)
        self.wanted = wanted
        self.acked = acked


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


class MissingExtra(RedisLeaseError, ImportError):
    """A feature needs a package of an extra that is not installed (:mod:`redis_lease.extras`).

    Also an ``ImportError``, as the import it stands for.

    Attributes:
        extra: the extra to install, e.g. ``dashboard`` for ``redis-lease[dashboard]``.
    """

    exit_code = 10

    def __init__(self, message: str, *, extra: str, **context: Any) -> None:
        super().__init__(message, **context)
        self.extra = extra


# -- handlers and effects -------------------------------------------------------------------


class PlanningDeferred(RedisLeaseError):
    """Planning met one of the job's transient planner errors: it is tried again later.

    The job names them with ``@job.planner(retry_on=...)``. The run stays ``planning``
    and is planned again after a back-off; the message (the run's ``plan_retry``
    decision) says when.
    """


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
