"""The scheduler tick: create due runs, then plan, dispatch, burst or finalize each open run
(:mod:`redis_lease.fleet.tick.open_runs`).

A tick starts work; it does not do it. It is idempotent: two ticks at once, or a
tick every minute, change nothing twice. Every decision is recorded with its
reason in the run's event log (``redis-lease status RUN`` shows them). An error
in one run or one job is recorded as an ``error`` decision and every other run
and job is still ticked; :attr:`TickResult.failures` lists what failed.

Each tick of a job first looks for a loss: the data set's mark against what the scheduler
remembers (:mod:`redis_lease.fleet.loss.data_set_mark`), then the job's lost runs, made again
where the schedule and catch-up policy cover them (:mod:`redis_lease.fleet.loss.lost_runs`);
once a tick, the run index is looked through for lost ad-hoc runs. A loss found is not a failure
of the tick: it is counted, named and acted on.

A tick of the tick leader (``redis-lease worker --job``, :mod:`.leader`) is fenced by its
token: it takes each job's lock through ``tick_lock.lua`` and asks, before each step
(the data set's mark, the job's record, lost runs, due runs, each open run, the ad-hoc
runs), whether it still leads; once not, it stops and says so in one ``not_leader``
decision, recorded nowhere (docs/concepts/tick-leader.md). When it still leads but a plain
tick (cron, rq-scheduler) took the job's lock meanwhile (the leader's step ran past the
lock's time), its tick of that job stops with one ``lock_lost`` decision, recorded nowhere,
and it goes on with the next job: a plain tick changes nothing about who leads.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from ...errors import RedisLeaseError, RedisUnavailable
from ...protocol.store.leader import (
    BUSY,
    LEADING,
    NOT_LEADING,
    STALE,
    TAKEN,
    Leadership,
    job_tick_lock,
    lead_state,
    still_leading,
)
from ...protocol.store.lease_store import LeaseStore
from ..jobs.job import Job, load_job
from ..loss import data_set_mark, lost_runs
from ..runs.lifecycle import Decision, Runs, to_ms
from .due_runs import NO_RECORD as NO_RECORD
from .due_runs import create_due_runs
from .open_runs import tick_run

log = logging.getLogger("redis_lease.tick")

#: Seconds a job's tick lock is held at most (a tick that dies frees it by then).
TICK_LOCK_SECONDS = 60
#: Decision kinds that mean some work failed.
FAILURE_KINDS = ("error",)
#: Told which run planned how many items so far (``redis-lease tick`` shows it).
TickProgress = Callable[[str, int], None]
#: The decision that ends a leader's tick once it no longer leads (recorded nowhere).
NOT_LEADER = "not_leader"
#: The decision that ends a leader's tick of one job once a plain tick took that job's lock
#: (recorded nowhere); the leader still leads and ticks its other jobs.
LOCK_LOST = "lock_lost"
#: Asked before each step of a job's tick: may it go on? A state of
#: :func:`~redis_lease.protocol.store.leader.lead_state` (a plain tick always goes on).
GoOn = Callable[[], str]


class _Stopped(BaseException):
    """A leader's tick found, between two steps, that it may not go on (a BaseException:
    no isolation of a run's or a job's errors may take it for one)."""

    def decision(self, job: Job) -> Decision:
        """The decision that says where and why the job's tick stopped."""
        raise NotImplementedError


class _NotLeading(_Stopped):
    """It no longer leads."""

    def decision(self, job: Job) -> Decision:
        """The ``not_leader`` decision."""
        return _not_leading(job)


class _LockLost(_Stopped):
    """It still leads, but another tick holds the job's lock."""

    def decision(self, job: Job) -> Decision:
        """The ``lock_lost`` decision."""
        return Decision(
            LOCK_LOST,
            job.name,
            "another tick (a plain one: cron, rq-scheduler) took this job's lock after this "
            "tick held it past its time: this job's tick stops here; the leader still leads",
        )


class TickResult(list[Decision]):
    """The decisions of a tick, in order; failures (errors) among them."""

    @property
    def failures(self) -> list[Decision]:
        """The decisions that say some work failed."""
        return [d for d in self if d.kind in FAILURE_KINDS]


def tick(
    store: LeaseStore,
    job_paths: Sequence[str],
    now: datetime | None = None,
    progress: TickProgress | None = None,
    leader: Leadership | None = None,
) -> TickResult:
    """One tick for each job path (``package.module:attr``); returns the decisions made.

    ``now`` is the tick's clock (default: the server's); every decision is made
    by it, so a test or a replay can tick at any time. ``progress`` is told the
    items planned so far while a run is planned. A job that fails (it cannot be
    imported, its tick raises) becomes an ``error`` decision and the other jobs
    are still ticked. ``leader``: the tick of the tick leader holding this lease,
    fenced by its token (a job a newer leader ticked is skipped; once the lease is
    another's, the tick stops with a ``not_leader`` decision). Raises
    RedisUnavailable when Redis cannot be reached at all.
    """
    runs = Runs(store)
    moment = now or runs.server_now()
    result = TickResult()
    for path in job_paths:
        work = partial(_tick_path, store, runs, path, moment, progress, leader)
        result += _isolated(runs, path, work, False)
        if result and result[-1].kind == NOT_LEADER:
            return result
    if leader is not None and not still_leading(store, leader):
        return result
    result += _isolated(
        runs, "ad-hoc runs", partial(lost_runs.scan_index, store, runs, moment), False
    )
    return result


def _tick_path(
    store: LeaseStore,
    runs: Runs,
    path: str,
    now: datetime,
    progress: TickProgress | None,
    leader: Leadership | None,
) -> list[Decision]:
    job = load_job(path)
    if leader is None:
        return tick_job(store, runs, path, job, now, progress)
    ttl_ms = TICK_LOCK_SECONDS * 1000
    with job_tick_lock(store, job.name, ttl_ms, leader) as (taken, owner):
        if taken == BUSY:
            return []  # another tick of this job is at work, as with the plain lock
        if taken == STALE:
            return [_not_leading(job)]
        go_on = partial(lead_state, store, leader, job.name, owner, ttl_ms)
        try:
            return _tick_locked(store, runs, path, job, now, progress, go_on)
        except _Stopped as stopped:  # before its first step
            return [stopped.decision(job)]


def _not_leading(job: Job) -> Decision:
    return Decision(
        NOT_LEADER,
        job.name,
        "this tick's leader no longer leads (another worker holds the lease, or a newer "
        "leader ticked this job): it stops here",
    )


def tick_job(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    now: datetime,
    progress: TickProgress | None = None,
) -> list[Decision]:
    """One tick of one job, under a per-job lock (a concurrent tick skips).

    First a loss is looked for (the data set's mark, then the job's lost runs, made
    again where covered); then due runs are created. Each open run is ticked on its
    own: an error in one is recorded in its event log as an ``error`` decision, and
    the job's other runs are still ticked. Last, the scheduler remembers the job's
    open runs (:mod:`redis_lease.fleet.loss.tick_memory`).
    """
    with job_tick_lock(store, job.name, TICK_LOCK_SECONDS * 1000) as (taken, _):
        if taken != TAKEN:
            return []
        return _tick_locked(store, runs, path, job, now, progress, lambda: LEADING)


def _tick_locked(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    now: datetime,
    progress: TickProgress | None,
    go_on: GoOn,
) -> list[Decision]:
    """One tick of one job under its lock; ``go_on`` is asked before each step."""
    _check(go_on)
    seen = data_set_mark.observe(store, job.name)
    work = partial(_tick_job_runs, store, runs, path, job, now, seen, progress, go_on)
    if seen.loss is None:
        return work()
    told = Decision("data_lost", job.name, seen.loss.reason)
    return [told, *_isolated(runs, job.name, work, False)]  # told even if the rest fails


def _check(go_on: GoOn) -> None:
    state = go_on()
    if state == NOT_LEADING:
        raise _NotLeading
    if state != LEADING:
        raise _LockLost


def _tick_job_runs(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    now: datetime,
    seen: data_set_mark.Observation,
    progress: TickProgress | None,
    go_on: GoOn,
) -> list[Decision]:
    """The job's tick after the mark was observed: lost runs, due runs, open runs; each
    step only when ``go_on`` says so, else the decisions so far and a ``not_leader`` (or a
    ``lock_lost``) one."""
    decisions: list[Decision] = []
    try:
        _check(go_on)
        first = _register(store, path, job, now, seen.id)
        _check(go_on)
        decisions += lost_runs.recover(store, runs, path, job, now, seen)
        _check(go_on)
        decisions += create_due_runs(store, runs, path, job, now, first, seen)
        for run_id in runs.open_runs(job.name):
            _check(go_on)
            told = partial(progress, run_id) if progress else None
            work = partial(tick_run, store, runs, path, job, run_id, now, told)
            decisions += _isolated(runs, run_id, work, True)
        _check(go_on)
        lost_runs.remember_open(store, runs, job)
    except _Stopped as stopped:
        decisions.append(stopped.decision(job))
    return decisions


def _isolated(
    runs: Runs, subject: str, work: Callable[[], list[Decision]], logged: bool
) -> list[Decision]:
    """The decisions of ``work``, or one ``error`` decision when it raises.

    ``logged``: the subject is a run, and the error goes to its event log too.
    Redis being unreachable is no one run's failure: it propagates.
    """
    try:
        return work()
    except RedisUnavailable:
        raise
    except Exception as error:  # isolated: every other run and job is still ticked
        return [_failure(runs, subject, error, logged)]


def _failure(runs: Runs, subject: str, error: Exception, logged: bool) -> Decision:
    detail = (
        str(error) if isinstance(error, RedisLeaseError) else f"{type(error).__name__}: {error}"
    )
    reason = "tick failed: " + " ".join(detail.split())
    if logged:
        with contextlib.suppress(RedisLeaseError):  # recording may fail for the same cause
            return runs.record_decision(subject, "error", reason)
    return Decision("error", subject, reason)


#: Settings a job's record may hold under names the options no longer have (release 0.9.0's
#: tick records them so: a fleet upgraded from it has them), dropped when the job is
#: recorded; a deadline_at or deadline_after not set is dropped too, so only the one given
#: shows.
STALE_SETTINGS = (
    *("lease_ttl", "backoff_base", "backoff_cap", "catch_up_grace", "shard_budget"),
    *("commit_interval", "max_workers", "deadline", "deadline_at", "deadline_after"),
)


def _register(store: LeaseStore, path: str, job: Job, now: datetime, data_set_id: str) -> bool:
    """Records the job's path and settings, and its copy of the data set's id; True on its
    first tick (no record of it yet)."""
    key = store.keys.job(job.name)
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        record: dict[Any, Any] = {"path": path, **job.settings(), "dataset": data_set_id}
        pipe.hset(key, mapping=record)
        pipe.hdel(key, *(name for name in STALE_SETTINGS if name not in record))
        pipe.hsetnx(key, "registered_at", str(to_ms(now)))
        pipe.sadd(store.keys.jobs, job.name)
        return bool(pipe.execute()[2])


def tick_and_arm(store: LeaseStore, job_paths: list[str], arm: bool = False) -> list[str]:
    """What the tick's RQ job (:func:`redis_lease.tick.tick_entry`) does: one tick of
    ``job_paths``, and with ``arm`` (the entries ``schedule install`` makes) a one-off tick
    made to wait at each job's next scheduled time, in the job's timezone
    (:func:`redis_lease.fleet.tick.schedule.arm_next`), while the job's schedule is installed.

    Returns:
        The tick's decisions, as text.

    Raises:
        RedisLeaseError: after the whole tick, when some work failed (so the RQ job is
            marked failed); each failure is in its run's event log.
    """
    result = tick(store, job_paths)
    if arm:
        from . import schedule

        for path in job_paths:
            with contextlib.suppress(RedisLeaseError):  # a job that fails to load: in result
                job = load_job(path)
                if schedule.installed(store, job):
                    schedule.arm_next(store, path, job)
    if result.failures:
        raise RedisLeaseError(
            f"{len(result.failures)} tick failures: " + "; ".join(map(str, result.failures))
        )
    return [str(d) for d in result]
