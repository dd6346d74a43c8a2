"""Shard jobs that fail, counted on their run, and the tick's dispatch back-off for a run
whose shard jobs keep failing.

A shard job that raises (or whose work horse dies) is counted in its run's record with
its last error (:func:`record_job_failure`); one that ends normally ends the streak
and the dispatch back-off together (:func:`end_failure_streak`). After
:data:`FAILURE_STREAK_LIMIT` failures in a row the tick dispatches nothing for a while
(:func:`hold_dispatch`, which starts the back-off with :func:`start_backoff`), then lets
one shard job try again. Each write is one small script on the run's record
(``lua/record_job_failure.lua``, ``end_failure_streak.lua``, ``start_backoff.lua``), so a
run deleted meanwhile is never made again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...limits import DISPATCH_BACKOFF_BASE, DISPATCH_BACKOFF_CAP, DISPATCH_FAILURE_STREAK
from ...limits import JOB_ERROR_MAX_BYTES as JOB_ERROR_MAX_BYTES
from ...protocol.store.lease_store import LeaseStore
from ...protocol.validation import clip
from ..runs.lifecycle import Decision, Runs

#: Shard jobs failed in a row before the tick backs off dispatching to the run.
FAILURE_STREAK_LIMIT = DISPATCH_FAILURE_STREAK
#: Seconds of the first back-off; each further failure doubles it, up to the cap.
BACKOFF_BASE = DISPATCH_BACKOFF_BASE
BACKOFF_CAP = DISPATCH_BACKOFF_CAP


@dataclass(frozen=True)
class JobFailures:
    """A run's failed shard jobs, from its record (see :func:`job_failures`).

    Attributes:
        count: shard jobs of the run that failed (``failed_jobs``).
        last_error: the last one's error, ``shard N: Type: message`` (``last_job_error``).
        last_error_at_ms: when it failed, server clock (``last_job_error_at``).
        streak: shard jobs failed in a row since one ended normally (``job_failure_streak``).
        backoff_until_ms: the tick dispatches nothing to the run before this time,
            tick clock (``dispatch_backoff_until``).
    """

    count: int = 0
    last_error: str = ""
    last_error_at_ms: int | None = None
    streak: int = 0
    backoff_until_ms: int | None = None

    def __bool__(self) -> bool:
        return self.count > 0


def job_failures(info: Mapping[str, str]) -> JobFailures:
    """The failed shard jobs recorded in a run's record (``RunStatus.info``, ``Runs.info``)."""

    def number(name: str) -> int:
        try:
            return int(info.get(name) or 0)
        except ValueError:
            return 0

    return JobFailures(
        count=number("failed_jobs"),
        last_error=info.get("last_job_error", ""),
        last_error_at_ms=number("last_job_error_at") or None,
        streak=number("job_failure_streak"),
        backoff_until_ms=number("dispatch_backoff_until") or None,
    )


def record_job_failure(store: LeaseStore, run_id: str, shard: int, error: str) -> bool:
    """Counts a failed shard job in the run's record with its error; False when no record.

    Best kept short: ``error`` is one line (it is clipped). One script: a run
    deleted meanwhile (retention) is not made again with only these fields.
    """
    line = clip(f"shard {shard}: " + " ".join(error.split()), JOB_ERROR_MAX_BYTES)
    with store.translating_errors(run_id):
        streak: int = store.scripts.call("record_job_failure", [store.keys.run(run_id)], [line])
    return streak >= 0


def end_failure_streak(store: LeaseStore, run_id: str, client: Any = None) -> None:
    """Ends the run's streak of failed shard jobs and its dispatch back-off (one script).

    ``client`` may be a pipeline to queue it in. Writes nothing when there is no streak.
    """
    keys = [store.keys.run(run_id)]
    if client is None:
        store.scripts.call("end_failure_streak", keys, [])
    else:
        store.scripts.run("end_failure_streak", keys, [], client=client)


def start_backoff(store: LeaseStore, run_id: str, streak: int, until_ms: int) -> bool:
    """Records a dispatch back-off until ``until_ms`` for a failure ``streak``; False
    (nothing written) when the streak changed since it was read."""
    with store.translating_errors(run_id):
        done: bool = store.scripts.call(
            "start_backoff", [store.keys.run(run_id)], [str(streak), str(until_ms)]
        )
    return done


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
    the streak is still the one read (:func:`start_backoff`); when it moved
    meanwhile, this tick holds and the next one decides.
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


__all__ = [
    "BACKOFF_BASE",
    "BACKOFF_CAP",
    "FAILURE_STREAK_LIMIT",
    "JOB_ERROR_MAX_BYTES",
    "JobFailures",
    "backoff_seconds",
    "end_failure_streak",
    "hold_dispatch",
    "job_failures",
    "record_job_failure",
    "start_backoff",
]
