"""Shard jobs that fail, counted on their run.

A shard job that raises (or whose work horse dies) is counted in its run's record with
its last error (:func:`record_job_failure`); one that ends normally ends the streak
and the dispatch back-off together (:func:`end_failure_streak`); the tick starts a
back-off (:func:`start_backoff`, see :mod:`redis_lease.fleet.dispatch_backoff`). Each is one small
script on the run's record, so a run deleted meanwhile is never made again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..protocol.store.lease_store import LeaseStore
from ..protocol.validation import clip

#: The longest ``last_job_error`` kept in a run's record, in UTF-8 bytes.
JOB_ERROR_MAX_BYTES = 1000


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


#: Counts a failed shard job on its run, in one step (nothing when the run has no record).
#: KEYS[1] the run's record; ARGV[1] the error line. Returns the streak, or -1 without a record.
_RECORD_FAILURE = """
local run = KEYS[1]
if redis.call('EXISTS', run) == 0 then return -1 end
local now = redis.call('TIME')
redis.call('HINCRBY', run, 'failed_jobs', 1)
local streak = redis.call('HINCRBY', run, 'job_failure_streak', 1)
redis.call('HSET', run, 'last_job_error', ARGV[1],
  'last_job_error_at', now[1] .. string.format('%03d', math.floor(tonumber(now[2]) / 1000)))
return streak
"""
#: Ends a run's streak of failed shard jobs and its back-off, in one step (a failure
#: counted meanwhile is never lost). KEYS[1] the run's record. Returns 1 when it wrote.
_END_STREAK = """
local run = KEYS[1]
local streak, seen = unpack(redis.call('HMGET', run, 'job_failure_streak',
  'dispatch_backoff_streak'))
if (streak or '0') == '0' and (seen or '0') == '0' then return 0 end
redis.call('HSET', run, 'job_failure_streak', '0', 'dispatch_backoff_streak', '0')
redis.call('HDEL', run, 'dispatch_backoff_until')
return 1
"""
#: Starts a back-off if the streak is still the one it was decided on. KEYS[1] the
#: run's record; ARGV[1] the streak, ARGV[2] the back-off's end (ms). Returns 1 when set.
_START_BACKOFF = """
local run = KEYS[1]
if redis.call('HGET', run, 'job_failure_streak') ~= ARGV[1] then return 0 end
redis.call('HSET', run, 'dispatch_backoff_until', ARGV[2], 'dispatch_backoff_streak', ARGV[1])
return 1
"""


def record_job_failure(store: LeaseStore, run_id: str, shard: int, error: str) -> bool:
    """Counts a failed shard job in the run's record with its error; False when no record.

    Best kept short: ``error`` is one line (it is clipped). One script: a run
    deleted meanwhile (retention) is not made again with only these fields.
    """
    line = clip(f"shard {shard}: " + " ".join(error.split()), JOB_ERROR_MAX_BYTES)
    script = store.client.register_script(_RECORD_FAILURE)
    with store.translating_errors(run_id):
        streak = script(keys=[store.keys.run(run_id)], args=[line])
    return int(streak) >= 0


def end_failure_streak(store: LeaseStore, run_id: str, client: Any = None) -> None:
    """Ends the run's streak of failed shard jobs and its dispatch back-off (one script).

    ``client`` may be a pipeline to queue it in. Writes nothing when there is no streak.
    """
    script = store.client.register_script(_END_STREAK)
    script(keys=[store.keys.run(run_id)], client=client)


def start_backoff(store: LeaseStore, run_id: str, streak: int, until_ms: int) -> bool:
    """Records a dispatch back-off until ``until_ms`` for a failure ``streak``; False
    (nothing written) when the streak changed since it was read."""
    script = store.client.register_script(_START_BACKOFF)
    with store.translating_errors(run_id):
        done = script(keys=[store.keys.run(run_id)], args=[str(streak), str(until_ms)])
    return bool(done)


__all__ = [
    "JOB_ERROR_MAX_BYTES",
    "JobFailures",
    "end_failure_streak",
    "job_failures",
    "record_job_failure",
    "start_backoff",
]
