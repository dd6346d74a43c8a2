"""The scheduler tick: create due runs, plan them, dispatch shard work, burst, finalize.

Each running run also gets the workers it needs to finish by its deadline
(:mod:`redis_lease.fleet.run_capacity`), for the exporter's ``redis_lease_workers_needed``.

A tick starts work; it does not do it. It is idempotent: two ticks at once, or a
tick every minute, change nothing twice. Every decision is recorded with its
reason in the run's event log (``redis-lease status RUN`` shows them). An error
in one run or one job is recorded as an ``error`` decision and every other run
and job is still ticked; :attr:`TickResult.failures` lists what failed.

Each tick of a job first looks for a loss: the data set's mark against what the tick
side remembers (:mod:`redis_lease.fleet.data_set`), then the job's lost runs, made again where
the schedule and catch-up policy cover them (:mod:`redis_lease.fleet.tick.lost_runs`); once a tick,
the run index is looked through for lost ad-hoc runs. A loss found is not a failure of
the tick: it is counted, named and acted on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from rq import get_current_job

from ...errors import NotFound, RedisLeaseError, RedisUnavailable
from ...limits import DEFAULT_PREFIX
from ...protocol.store.lease_store import LeaseStore
from ...protocol.values import RunStatus
from .. import data_set, run_ages, run_capacity, shard_jobs
from ..dispatch_backoff import FAILURE_STREAK_LIMIT, hold_dispatch
from ..job import Job, load_job
from ..locks import lock
from ..runs import Decision, PlanProgress, Runs, to_ms
from ..shard_job_failures import job_failures
from ..shard_job_store import close_job_store, job_store
from . import lost_runs
from .due_runs import NO_RECORD as NO_RECORD
from .due_runs import create_due_runs
from .missed_runs import business_date as business_date

log = logging.getLogger("redis_lease.tick")

#: Seconds between completion-rate samples used to project a run's finish.
RATE_WINDOW = 5.0
TICK_LOCK_SECONDS = 60
#: ``workers_needed`` of a run whose need cannot be computed yet.
UNKNOWN = "unknown"
#: Decision kinds that mean some work failed.
FAILURE_KINDS = ("error",)
#: Told which run planned how many items so far (``redis-lease tick`` shows it).
TickProgress = Callable[[str, int], None]


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
) -> TickResult:
    """One tick for each job path (``package.module:attr``); returns the decisions made.

    ``now`` is the tick's clock (default: the server's); every decision is made
    by it, so a test or a replay can tick at any time. ``progress`` is told the
    items planned so far while a run is planned. A job that fails (it cannot be
    imported, its tick raises) becomes an ``error`` decision and the other jobs
    are still ticked. Raises RedisUnavailable when Redis cannot be reached at all.
    """
    runs = Runs(store)
    moment = now or runs.server_now()
    result = TickResult()
    for path in job_paths:
        work = partial(_tick_path, store, runs, path, moment, progress)
        result += _isolated(runs, path, work, False)
    result += _isolated(
        runs, "ad-hoc runs", partial(lost_runs.scan_index, store, runs, moment), False
    )
    return result


def _tick_path(
    store: LeaseStore, runs: Runs, path: str, now: datetime, progress: TickProgress | None
) -> list[Decision]:
    return tick_job(store, runs, path, load_job(path), now, progress)


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
    the job's other runs are still ticked. Last, the tick side remembers the job's
    open runs (:mod:`redis_lease.fleet.remembered`).
    """
    with lock(store, f"{store.keys.job(job.name)}:tick", TICK_LOCK_SECONDS * 1000) as taken:
        if not taken:
            return []
        seen = data_set.observe(store, job.name)
        work = partial(_tick_job_runs, store, runs, path, job, now, seen, progress)
        if seen.loss is None:
            return work()
        told = Decision("data_lost", job.name, seen.loss.reason)
        return [told, *_isolated(runs, job.name, work, False)]  # told even if the rest fails


def _tick_job_runs(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    now: datetime,
    seen: data_set.Observation,
    progress: TickProgress | None,
) -> list[Decision]:
    """The job's tick after the mark was observed: lost runs, due runs, open runs."""
    first = _register(store, path, job, now, seen.id)
    decisions = lost_runs.recover(store, runs, path, job, now, seen)
    decisions += create_due_runs(store, runs, path, job, now, first)
    for run_id in runs.open_runs(job.name):
        work = partial(_tick_run, store, runs, path, job, run_id, now, progress)
        decisions += _isolated(runs, run_id, work, True)
    lost_runs.remember_open(store, runs, job)
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


def _register(store: LeaseStore, path: str, job: Job, now: datetime, data_set_id: str) -> bool:
    """Records the job's path and settings, and its copy of the data set's id; True on its
    first tick (no record of it yet)."""
    key = store.keys.job(job.name)
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        record: dict[Any, Any] = {"path": path, **job.settings(), "dataset": data_set_id}
        pipe.hset(key, mapping=record)
        pipe.hsetnx(key, "registered_at", str(to_ms(now)))
        pipe.sadd(store.keys.jobs, job.name)
        return bool(pipe.execute()[1])


# -- ticking one run --------------------------------------------------------------


def _tick_run(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    run_id: str,
    now: datetime,
    progress: TickProgress | None = None,
) -> list[Decision]:
    """Plans, finalizes or dispatches one open run; a run whose record went missing since
    this tick looked for lost runs is left to the next tick's look."""
    try:
        info = runs.info(run_id)
    except NotFound:
        return []
    decisions: list[Decision] = []
    if info["state"] == "planning":
        planned = _plan(runs, job, run_id, partial(progress, run_id) if progress else None)
        if planned is None or planned.kind == "finalize":
            return [planned] if planned else []
        decisions.append(planned)
    elif runs.retire_if_final(run_id, info) or info["state"] != "running":
        return decisions
    status, per_shard = store.status_by_shard(run_id)
    deadline_ms = int(status.info.get("deadline_at", "0"))
    now_ms = to_ms(now)
    run_ages.record(store, status, now_ms)
    if deadline_ms and now_ms >= deadline_ms:
        final = runs.finalize(run_id, "deadline passed")
    elif status.unfinished == 0:
        final = runs.finalize(run_id, "no item left to work")
    else:
        work = _dispatch(store, runs, path, job, status, per_shard, now_ms, deadline_ms)
        try:  # after the dispatch, and never undoing it: a figure for autoscalers
            _publish_need(store, job, status, now_ms, deadline_ms)
        except RedisLeaseError as error:
            log.warning("could not publish workers_needed of run %r: %s", run_id, error)
        return decisions + work
    return decisions + ([final] if final else [])


def _publish_need(
    store: LeaseStore, job: Job, status: RunStatus, now_ms: int, deadline_ms: int
) -> None:
    """Records the workers the run needs to finish by its deadline, for the exporter.

    ``workers_needed`` in the run's record is a count, or ``unknown`` (no
    deadline, or no worker has recorded a pass yet); ``workers_needed_basis``
    says why, ``workers_needed_at`` when (the tick's clock, ms).
    """
    opts = job.options
    need = run_capacity.run_need(
        run_capacity.measured_of(store, status),
        status.unfinished,
        (deadline_ms - now_ms) / 1000 if deadline_ms else None,
        spare_nodes=opts.spare_nodes,
        workers_per_node=opts.workers_per_node,
    )
    fields: dict[Any, Any] = {
        "workers_needed": UNKNOWN if need.workers is None else str(need.workers),
        "workers_needed_basis": need.basis,
        "workers_needed_at": str(now_ms),
    }
    with store.translating_errors(status.run_id):
        store.client.hset(store.keys.run(status.run_id), mapping=fields)


def _plan(
    runs: Runs, job: Job, run_id: str, progress: PlanProgress | None = None
) -> Decision | None:
    """Plans the run; None when another planner holds it.

    Returns a ``plan`` decision, or a ``finalize`` one when planning failed the run.
    An interruption that leaves the run planning (Redis, say) raises, for the next
    tick to plan again.
    """
    try:
        planned = runs.plan(job, run_id, progress)
    except Exception as error:
        if runs.info(run_id)["state"] != "failed":
            raise
        return Decision("finalize", run_id, f"failed: planning error: {error!r}")
    return None if planned is None else Decision("plan", run_id, f"planned {planned} items")


def _dispatch(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    status: RunStatus,
    per_shard: list[dict[str, int]],
    now_ms: int,
    deadline_ms: int,
) -> list[Decision]:
    """Enqueues a shard job where work remains and no live job is on the shard.

    After :data:`FAILURE_STREAK_LIMIT` shard jobs of the run failed in a row, it
    backs off (:func:`~redis_lease.fleet.dispatch_backoff.hold_dispatch`); no burst is added
    while shard jobs fail.
    """
    opts = job.options
    run_id = status.run_id
    live = shard_jobs.live_jobs(store, run_id)  # counts the failed jobs it finds on the run
    status.info.update(runs.info(run_id))
    total_live = sum(len(ids) for ids in live.values())
    decisions: list[Decision] = []
    cap, probing = opts.max_workers, False
    failures = job_failures(status.info)
    if failures.streak >= FAILURE_STREAK_LIMIT:
        held, backoff = hold_dispatch(store, runs, status.info, run_id, now_ms)
        decisions += [backoff] if backoff else []
        if held:
            return decisions
        cap, probing = 1, True  # the back-off ended: one shard job tries again
    enqueued = 0
    for shard, counts in enumerate(per_shard):
        if RunStatus.unfinished_of(counts) == 0:
            continue
        have = len(live.get(shard, []))
        while have < opts.workers_per_shard and total_live < cap:
            shard_jobs.enqueue_shard(store, path, opts.queue, run_id, shard, opts.shard_budget)
            have, total_live, enqueued = have + 1, total_live + 1, enqueued + 1
    if enqueued:
        reason = f"enqueued {enqueued} shard jobs where no job was live"
        if probing:
            reason += f" (trying again after {failures.streak} failed shard jobs)"
        decisions.append(runs.record_decision(run_id, "dispatch", reason))
    if failures.streak:
        return decisions  # no burst capacity for work that fails
    burst = _burst(store, runs, path, job, status, per_shard, total_live, now_ms, deadline_ms)
    return decisions + ([burst] if burst else [])


def _burst(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    status: RunStatus,
    per_shard: list[dict[str, int]],
    total_live: int,
    now_ms: int,
    deadline_ms: int,
) -> Decision | None:
    """Adds shard jobs (up to max_workers) when the projected finish passes the deadline.

    The rate is of finished items (done or dead: no longer work); the work left is
    the unfinished items. Both come from :class:`~redis_lease.protocol.values.RunStatus`.
    Work that fails gets no burst: when attempts failed since the last sample and
    none committed, more shard jobs would only fail the same way.
    """
    opts = job.options
    run_id = status.run_id
    info = status.info
    sample_at, sample_done = int(info.get("sample_at", "0")), int(info.get("sample_done", "0"))
    if sample_at and now_ms - sample_at < RATE_WINDOW * 1000:
        return None
    commits, failures = status.counters.get("commits", 0), status.counters.get("failures", 0)
    sample: dict[Any, Any] = {
        "sample_at": now_ms,
        "sample_done": status.finished,
        "sample_commits": commits,
        "sample_failures": failures,
    }
    with store.translating_errors(run_id):
        store.client.hset(store.keys.run(run_id), mapping=sample)
    if not sample_at or not deadline_ms:
        return None
    failing = failures > int(info.get("sample_failures", "0")) and commits == int(
        info.get("sample_commits", "0")
    )
    rate = (status.finished - sample_done) / ((now_ms - sample_at) / 1000)
    projected_ms = now_ms + status.unfinished / rate * 1000 if rate > 0 else float("inf")
    fields: dict[Any, Any] = {"rate_per_s": f"{rate:.6g}"}  # a slow run's rate is not 0
    if projected_ms != float("inf"):
        fields["projected_finish_at"] = int(projected_ms)
    with store.translating_errors(run_id):
        store.client.hset(store.keys.run(run_id), mapping=fields)
    if projected_ms <= deadline_ms or total_live >= opts.max_workers or failing:
        return None
    busiest = sorted(range(len(per_shard)), key=lambda s: -per_shard[s]["pending"])
    targets = [s for s in busiest if per_shard[s]["pending"] > 0][: opts.max_workers - total_live]
    if not targets:
        return None
    for shard in targets:
        shard_jobs.enqueue_shard(store, path, opts.queue, run_id, shard, opts.shard_budget)
    when = "never at this rate" if rate <= 0 else f"in {(projected_ms - now_ms) / 1000:.0f}s"
    return runs.record_decision(
        run_id,
        "burst",
        f"projected finish {when} passes the deadline in {(deadline_ms - now_ms) / 1000:.0f}s "
        f"at {rate:.2f} items/s; +{len(targets)} shard jobs (cap {opts.max_workers})",
    )


def tick_entry(job_paths: list[str], prefix: str = DEFAULT_PREFIX, arm: bool = False) -> list[str]:
    """The RQ job that rq-scheduler (or ``rq cron``) runs: one tick on the job's connection.

    With ``arm`` (the entries ``schedule install`` makes) it then makes sure a
    one-off tick waits at each job's next scheduled time, in the job's timezone
    (:func:`redis_lease.fleet.tick.schedule.arm_next`), while the job's schedule is installed.
    Raises RedisLeaseError after the whole tick when some work failed, so the RQ
    job is marked failed; each failure is in its run's event log.
    """
    rq_job = get_current_job()
    if rq_job is None:
        raise RedisLeaseError("tick_entry runs inside an RQ worker; call tick() directly")
    store = job_store(rq_job.connection, prefix)
    try:
        return _tick_job(store, job_paths, arm)
    finally:
        close_job_store(store, rq_job.connection)


# RQ stores a job's function as ``<__module__>.<name>``: a tick job, whoever enqueues the
# function (``rq cron`` too), names it where every release finds it (docs/architecture.md).
tick_entry.__module__ = "redis_lease.tick"


def _tick_job(store: LeaseStore, job_paths: list[str], arm: bool) -> list[str]:
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
