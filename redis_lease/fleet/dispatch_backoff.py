"""The tick's dispatch back-off for a run whose shard jobs keep failing.

A shard job that raises (or whose work horse dies) is counted on its run
(:func:`~redis_lease.fleet.shard_job_failures.record_job_failure`); one that ends normally ends the
streak and the back-off together (:func:`~redis_lease.fleet.shard_job_failures.end_failure_streak`).
After :data:`FAILURE_STREAK_LIMIT` failures in a row the tick dispatches nothing
for a while (:func:`hold_dispatch`), then lets one shard job try again.
"""

from __future__ import annotations

from ..protocol.store.lease_store import LeaseStore
from .runs import Decision, Runs
from .shard_job_failures import job_failures, start_backoff

#: Shard jobs failed in a row before the tick backs off dispatching to the run.
FAILURE_STREAK_LIMIT = 3
#: Seconds of the first back-off; each further failure doubles it, up to the cap.
BACKOFF_BASE = 30.0
BACKOFF_CAP = 3600.0


def backoff_seconds(streak: int) -> float:
    """The back-off after ``streak`` shard jobs failed in a row: doubling from
    :data:`BACKOFF_BASE` at the limit, up to :data:`BACKOFF_CAP`."""
    exponent = min(max(0, streak - FAILURE_STREAK_LIMIT), 20)
    return min(BACKOFF_BASE * (1 << exponent), BACKOFF_CAP)


def hold_dispatch(
    store: LeaseStore, runs: Runs, info: dict[str, str], run_id: str, now_ms: int
) -> tuple[bool, Decision | None]:
    """Whether to hold dispatching to a run whose shard jobs keep failing; a ``backoff``
    decision when the back-off starts or grows (new failures since the last one).

    Each back-off is counted from the tick that first sees the failures, by the
    tick's clock; when it ends, one shard job tries again (the caller's cap), and
    its failure starts a back-off twice as long. The back-off is recorded only if
    the streak is still the one read (:func:`~redis_lease.fleet.runs.start_backoff`);
    when it moved meanwhile, this tick holds and the next one decides.
    """
    failures = job_failures(info)
    seen = int(info.get("dispatch_backoff_streak") or 0)
    until = failures.backoff_until_ms or 0
    if failures.streak == seen:
        return now_ms < until, None
    seconds = backoff_seconds(failures.streak)
    until = now_ms + int(seconds * 1000)
    if not start_backoff(store, run_id, failures.streak, until):
        return True, None
    reason = (
        f"{failures.streak} shard jobs failed in a row ({failures.count} in all; last: "
        f"{failures.last_error}); dispatching nothing for {seconds:.0f}s, then one shard "
        "job tries again"
    )
    return True, runs.record_decision(run_id, "backoff", reason)
