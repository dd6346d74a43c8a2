"""The commit, fail or release that ends each handler's attempt, sent in batches.

Here a settlement is that one request: a commit, a fail or a release of an item. This
module turns a handler's answer or error into its settlement, sends the settlements
together in one round trip, and counts them in the pass's report.

A handler returns its result, or a :class:`HandlerResult` with a label or guarded writes.
It raises to fail its item (:class:`~redis_lease.errors.PermanentError`: for good), or
raises :class:`~redis_lease.errors.Throttled` or :class:`~redis_lease.errors.SlotTimeout`
to give it back for later. A handler whose own write a full Redis refused gives its item
back too, its attempt not counted (:data:`FULL_RETRY_DELAY`). :class:`PendingSettlements`
holds the settlements until they are sent together; the keeper renews their leases
meanwhile. A settlement that fails (Redis gone past the retries, a refusal) leaves its
item to its lease expiry, and the pass goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import (
    ConditionFailed,
    InvalidInput,
    LeaseError,
    LeaseLost,
    NotReplicated,
    PermanentError,
    RedisLeaseError,
    RedisUnavailable,
    SlotTimeout,
    Throttled,
)
from ...protocol.guards import Condition, Write
from ...protocol.leases import CommitRequest, FailRequest, ReleaseRequest, SettleRequest
from ...protocol.store.lease_store import LeaseStore
from ..full_redis import is_full, notice_full
from ..jobs.live_lease import ActiveLease
from .lease_keeper import LeaseKeeper

log = logging.getLogger("redis_lease.worker")

__all__ = ["SLOT_RETRY_DELAY", "HandlerResult", "ShardReport"]

#: Seconds before an item released for want of a provider slot is due again.
SLOT_RETRY_DELAY = 1.0
#: Seconds before an item whose handler met a full Redis is due again (its attempt is not
#: counted: a full Redis would otherwise use up its attempts and leave it dead).
FULL_RETRY_DELAY = 2.0
#: Seconds before settlements that met an unreachable or busy Redis are sent again.
RETRY_DELAY = 1.0
#: A settlement to send and the report's counter its success adds to; None: nothing to send.
Settlement = tuple[SettleRequest, str] | None


@dataclass(frozen=True)
class HandlerResult:
    """A handler's answer with a label (counted as ``outcome_<label>``) or guarded writes."""

    result: Any = None
    conditions: tuple[Condition, ...] = ()
    writes: tuple[Write, ...] = ()
    label: str = ""


@dataclass
class ShardReport:
    """What one pass over a shard did."""

    committed: int = 0
    failed: int = 0
    #: Leases lost to another holder (refused, or found lost before the handler started).
    stale: int = 0
    released: int = 0
    throttled: int = 0
    stopped: bool = False
    drained: bool = False
    closed: bool = False
    errors: list[str] = field(default_factory=list)
    #: Items left to their lease expiry after an error while settling them.
    abandoned: int = 0
    #: Handlers run (ended, whatever their outcome).
    handled: int = 0
    #: The summed wall time of those handlers, in seconds.
    handler_seconds: float = 0.0


class PendingSettlements:
    """Settlements (commits, fails, releases) waiting to be sent together in one round trip;
    their leases stay with the keeper meanwhile."""

    def __init__(
        self, store: LeaseStore, keeper: LeaseKeeper, report: ShardReport, interval: float
    ) -> None:
        self.store, self.keeper, self.report, self.interval = store, keeper, report, interval
        #: (lease, request, the report's counter its success adds to)
        self.waiting: list[tuple[ActiveLease, SettleRequest, str]] = []
        self.oldest = 0.0

    def add(self, active: ActiveLease, request: SettleRequest, counter: str) -> None:
        """Queues a settlement; sends the queue when its oldest has waited long enough."""
        if not self.waiting:
            self.oldest = time.monotonic()
        self.waiting.append((active, request, counter))
        self.flush_due()

    def due_in(self) -> float:
        """Seconds until the waiting settlements are due (infinite when none wait)."""
        if not self.waiting:
            return math.inf
        return max(0.0, self.oldest + self.interval - time.monotonic())

    def flush_due(self) -> None:
        """Sends the waiting settlements once the oldest has waited ``interval`` seconds."""
        if self.waiting and time.monotonic() - self.oldest >= self.interval:
            self.flush()

    def flush(self) -> None:
        """Sends every waiting settlement in one round trip and handles each answer.

        When Redis cannot be reached or is busy past the retries (a stall, a failover),
        the settlements whose leases this process still holds wait again, kept renewed,
        and are sent again :data:`RETRY_DELAY` seconds later (a commit repeated with its
        token returns what the first stored); the others are left to their lease expiry.
        The job goes on either way.
        """
        if not self.waiting:
            return
        waiting, self.waiting = self.waiting, []
        # No renewal of these leases goes out from here on: one behind its commit is refused.
        self.keeper.settle([active for active, _, _ in waiting])
        try:
            answers = self.store.settle_many([request for _, request, _ in waiting])
        except RedisUnavailable as error:
            kept = self._wait_again(waiting, error)
            waiting = [entry for entry in waiting if not any(entry is k for k in kept)]
            answers = [error] * len(waiting)
        except LeaseError as error:
            answers = [error] * len(waiting)
        for (active, request, counter), answer in zip(waiting, answers, strict=True):
            self.keeper.drop(active)
            self._settle_answer(active, request, counter, answer)

    def _wait_again(
        self, waiting: list[tuple[ActiveLease, SettleRequest, str]], error: RedisUnavailable
    ) -> list[tuple[ActiveLease, SettleRequest, str]]:
        """Puts back the settlements whose leases have not run out by this process's clock
        (kept renewed again), to go :data:`RETRY_DELAY` seconds from now; returns them.
        (A lease taken over meanwhile refuses its settlement: the fence decides.)"""
        now = time.monotonic()
        kept = [e for e in waiting if not e[0].lost and now < e[0].valid_until]
        for active, _, _ in kept:
            self.keeper.hold(active)
        if kept and not notice_full(error, f"{len(kept)} settlements wait to be sent again"):
            log.warning("%d settlements wait for Redis to send them again: %s", len(kept), error)
        if kept:
            self.waiting = kept + self.waiting
            self.oldest = now + RETRY_DELAY - self.interval
        return kept

    def flush_all(self) -> None:
        """Sends every waiting settlement, again while Redis is away and their leases are
        held (the end of a pass: nothing is left waiting)."""
        self.flush()
        while self.waiting:
            time.sleep(max(0.0, self.due_in()))
            self.flush()

    def _settle_answer(
        self, active: ActiveLease, request: SettleRequest, counter: str, answer: Any
    ) -> None:
        report = self.report
        commit = isinstance(request, CommitRequest)
        if isinstance(answer, LeaseLost):
            mark_stale(active, report, answer)
        elif commit and isinstance(answer, InvalidInput):  # e.g. a result that is not JSON
            if _settle(self.store.fail, active, report, f"permanent: {answer}", permanent=True):
                report.failed += 1
        elif commit and isinstance(answer, ConditionFailed):
            # What the handler read changed before the commit: back at once, read again.
            if _settle(self.store.release, active, report):
                report.released += 1
        elif isinstance(answer, LeaseError):
            action = type(request).__name__.removesuffix("Request").lower()
            _abandon(active, report, action, answer)
        else:
            setattr(report, counter, getattr(report, counter) + 1)


def settlement_of(active: ActiveLease, answer: Any, error: BaseException | None) -> Settlement:
    """What a handler's answer or error asks for: a settlement and its counter, or None
    when the lease was lost (the item is another holder's: nothing to write)."""
    if error is None:
        if isinstance(answer, HandlerResult):
            request = CommitRequest(
                active.lease, answer.result, answer.conditions, answer.writes, answer.label
            )
            return request, "committed"
        return CommitRequest(active.lease, answer), "committed"
    if not isinstance(error, (Exception, asyncio.CancelledError)):
        raise error  # KeyboardInterrupt, SystemExit: not the item's doing
    if isinstance(error, LeaseLost):
        return None
    if isinstance(error, PermanentError):
        return FailRequest(active.lease, f"permanent: {error}", permanent=True), "failed"
    if isinstance(error, Throttled):  # not the item's fault: back later, attempt not counted
        return ReleaseRequest(active.lease, error.delay_ms / 1000), "throttled"
    if isinstance(error, SlotTimeout):
        return ReleaseRequest(active.lease, SLOT_RETRY_DELAY), "throttled"
    if isinstance(error, NotReplicated):  # an intent the replicas lacked: nothing was sent
        return ReleaseRequest(active.lease, SLOT_RETRY_DELAY), "throttled"
    if is_full(error):  # the handler's own write met a full Redis: not the item's fault
        return ReleaseRequest(active.lease, FULL_RETRY_DELAY), "throttled"
    # The handler is user code: any other failure is a failed attempt.
    return FailRequest(active.lease, f"{type(error).__name__}: {error}"), "failed"


def _settle(
    call: Callable[..., Any], active: ActiveLease, report: ShardReport, *args: Any, **kw: Any
) -> bool:
    """Fails or releases the item; True when that was done.

    A lease lost meanwhile is counted as stale. Any other error (Redis gone
    past the retries, a refusal) is logged and the item left to its lease
    expiry: the job goes on with the next item.
    """
    try:
        call(active.lease, *args, **kw)
    except LeaseLost as error:
        mark_stale(active, report, error)
        return False
    except RedisLeaseError as error:
        _abandon(active, report, getattr(call, "__name__", "settle"), error)
        return False
    return True


def mark_stale(active: ActiveLease, report: ShardReport, error: LeaseLost) -> None:
    """Counts a lease lost meanwhile: the item is another holder's now."""
    active.mark_lost()
    report.stale += 1
    log.info("stale: %s", error)


def _abandon(active: ActiveLease, report: ShardReport, action: str, error: Exception) -> None:
    """Leaves an item to its lease expiry after ``action`` failed; logs it with the item."""
    report.abandoned += 1
    report.errors.append(f"{action} of item {active.item_id!r} failed: {error}")
    if notice_full(error, f"{action} of item {active.item_id!r} left to its lease expiry"):
        return
    log.warning(
        "%s of item %r of run %r (token %s) failed, so it is left to its lease expiry: %s: %s",
        action,
        active.item_id,
        active.run_id,
        active.token,
        type(error).__name__,
        error,
    )
