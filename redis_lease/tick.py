"""The scheduler tick: create due runs, plan them, dispatch shard work, burst, finalize.

Each running run also gets the workers it needs to finish by its deadline
(:mod:`redis_lease.capacity`), for the exporter's ``redis_lease_workers_needed``.

A tick starts work; it does not do it. It is idempotent: two ticks at once, or a
tick every minute, change nothing twice. Every decision is recorded with its
reason in the run's event log (``redis-lease status RUN`` shows them). An error
in one run or one job is recorded as an ``error`` decision and every other run
and job is still ticked; :attr:`TickResult.failures` lists what failed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from croniter import croniter
from rq import get_current_job

from . import age_history, capacity, dispatch, missed_runs
from .backoff import FAILURE_STREAK_LIMIT, hold_dispatch
from .errors import NotFound, RedisLeaseError, RedisUnavailable
from .job_failures import job_failures
from .jobs import Job, load_job
from .lease import RunStatus
from .limits import DEFAULT_PREFIX
from .locks import lock
from .missed_runs import business_date as business_date
from .runs import Decision, PlanProgress, Runs, to_ms
from .store import LeaseStore

log = logging.getLogger("redis_lease.tick")

#: Seconds between completion-rate samples used to project a run's finish.
RATE_WINDOW = 5.0
TICK_LOCK_SECONDS = 60
#: ``workers_needed`` of a run whose need cannot be computed yet.
UNKNOWN = "unknown"
#: Decision kinds that mean some work failed: an error, a run dropped because it is gone.
FAILURE_KINDS = ("error", "drop")
#: Told which run planned how many items so far (``redis-lease tick`` shows it).
TickProgress = Callable[[str, int], None]
#: Said when a job has no record of any run on the server.
NO_RECORD = (
    "no record of this job's runs on the server: a new job, or the server lost its data "
    "(check persistence)"
)


class TickResult(list[Decision]):
    """The decisions of a tick, in order; failures (errors, dropped runs) among them."""

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

    Each open run is ticked on its own: an error in one is recorded in its event
    log as an ``error`` decision, and the job's other runs are still ticked.
    """
    with lock(store, f"{store.keys.job(job.name)}:tick", TICK_LOCK_SECONDS * 1000) as taken:
        if not taken:
            return []
        first = _register(store, path, job, now)
        decisions = _create_due_runs(store, runs, path, job, now, first)
        for run_id in runs.open_runs(job.name):
            work = partial(_tick_run, store, runs, path, job, run_id, now, progress)
            decisions += _isolated(runs, run_id, work, True)
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


def _register(store: LeaseStore, path: str, job: Job, now: datetime) -> bool:
    """Records the job's path and settings; True on its first tick (no record of it yet)."""
    key = store.keys.job(job.name)
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        record: dict[Any, Any] = {"path": path, **job.settings()}
        pipe.hset(key, mapping=record)
        pipe.hsetnx(key, "registered_at", str(to_ms(now)))
        pipe.sadd(store.keys.jobs, job.name)
        return bool(pipe.execute()[1])


# -- creating due runs ----------------------------------------------------------


def _create_due_runs(
    store: LeaseStore, runs: Runs, path: str, job: Job, now: datetime, first: bool
) -> list[Decision]:
    """Creates the runs that are due, by the job's definition and its record on the server.

    The window is the job's ``catch_up_days`` back from now, after the last
    scheduled time a tick handled (``last_fire_at``), else after the newest run's
    creation less ``catch_up_grace``. With no record of the job's runs at all (a
    new job, or a server that lost its data) the due run is the latest scheduled
    time in the window, and it is on time while its deadline is ahead (whatever
    the policy: the server lost it, nothing missed it). The catch-up policy then
    picks: ``all`` missed dates, the ``latest``, or ``none`` but those on time
    (within ``catch_up_grace``). The dates it skips were missed, and so were those
    between ``last_fire_at`` and the window's start: each is counted once in the job's
    ``missed`` tally (``redis_lease_missed_runs_total``, :mod:`redis_lease.missed_runs`),
    and a ``missed`` decision on the run created with them names them.
    """
    opts = job.options
    grace = timedelta(seconds=opts.catch_up_grace)
    with store.translating_errors():
        record = _JobRecord.read(store, job)
    fires = job.fire_times(record.since(now, opts.catch_up_days, grace), now)
    if record.fresh:
        fires = fires[-1:]
    with store.translating_errors():
        todo = record.without_runs(store, job, fires)
    if record.paused_by is not None:
        return missed_runs.skip_paused(store, job, record.paused_by, fires, todo)
    on_time = [fire for fire in todo if now - fire <= grace or _still_due(record, job, fire, now)]
    if opts.catch_up == "all":
        chosen = todo
    elif opts.catch_up == "latest":
        chosen = todo[-1:] if todo and todo[-1] == fires[-1] else []
    else:
        chosen = on_time
    skipped = [fire for fire in todo if fire not in chosen]
    decisions = [
        decision
        for fire in chosen
        if (decision := _create(runs, job, fire, now, fire not in on_time, record.fresh, skipped))
    ]
    older = missed_runs.older_dates(
        job, record.handled(grace), now - timedelta(days=opts.catch_up_days)
    )
    # After the runs exist: a crash before this repeats, harmlessly. A new job (or a
    # server that lost its data) missed nothing: nothing expected it.
    missed = missed_runs.record_handled(
        store, job, fires, skipped, older=older, count=not record.fresh
    )
    if missed and decisions:
        note = missed_runs.missed_decision(runs, path, job, decisions[-1].run_id, missed)
        decisions.append(note)
    if first and record.fresh and not decisions:
        decisions.append(Decision("waiting", job.name, _next_fire_note(path, job, now)))
    return decisions


def _still_due(record: _JobRecord, job: Job, fire: datetime, now: datetime) -> bool:
    """With no record of the job's runs, a scheduled time whose deadline is ahead is due."""
    return record.fresh and job.deadline_for(business_date(job, fire), fire) > now


@dataclass(frozen=True)
class _JobRecord:
    """What the server knows of a job's schedule.

    The last scheduled time a tick handled, and when the job's newest run was
    created; both None when the server has no record of the job's runs at all.
    """

    last_fire: datetime | None
    newest_run: datetime | None
    #: Who paused the job's schedule (``redis-lease schedule pause``), None when it runs.
    paused_by: str | None = None

    @classmethod
    def read(cls, store: LeaseStore, job: Job) -> _JobRecord:
        """Reads the job's record in one round trip."""
        pipe = store.client.pipeline(transaction=False)
        pipe.hmget(store.keys.job(job.name), ["last_fire_at", "paused_by"])
        pipe.zrange(store.keys.job_dates(job.name), -1, -1, withscores=True)
        (last_raw, paused_by), newest = pipe.execute()
        return cls(
            datetime.fromtimestamp(int(last_raw) / 1000, job.zone) if last_raw else None,
            datetime.fromtimestamp(newest[0][1] / 1000, job.zone) if newest else None,
            paused_by.decode() if isinstance(paused_by, bytes) else paused_by,
        )

    @property
    def fresh(self) -> bool:
        """No record of the job's runs: a new job, or a server that lost its data."""
        return self.last_fire is None and self.newest_run is None

    def handled(self, grace: timedelta) -> datetime | None:
        """The last scheduled time a tick handled; with runs made before any tick, as if
        it ticked when the newest was made; None with no record."""
        if self.last_fire is not None:
            return self.last_fire
        return None if self.newest_run is None else self.newest_run - grace

    def since(self, now: datetime, days: int, grace: timedelta) -> datetime:
        """Where the window of scheduled times to consider begins (exclusive)."""
        since = now - timedelta(days=days)
        handled = self.handled(grace)
        return since if handled is None else max(since, handled)

    @staticmethod
    def without_runs(store: LeaseStore, job: Job, fires: list[datetime]) -> list[datetime]:
        """The scheduled times whose business date has no run (created or skipped) yet."""
        pipe = store.client.pipeline(transaction=False)
        for fire in fires:
            pipe.zscore(store.keys.job_dates(job.name), business_date(job, fire).isoformat())
        return [fire for fire, seen in zip(fires, pipe.execute(), strict=True) if seen is None]


def _create(
    runs: Runs,
    job: Job,
    fire: datetime,
    now: datetime,
    late: bool,
    fresh: bool,
    skipped: list[datetime],
) -> Decision | None:
    """Creates the run of one scheduled time; its decision, or None when it existed."""
    day = business_date(job, fire)
    # A run started late keeps its full window: its deadline moves with its start.
    window = job.deadline_for(day, fire) - fire
    start = now if late else fire
    run_id, created = runs.ensure(job, day, start, start + window)
    if not created:
        return None
    if late:
        reason = (
            f"missed at {fire.isoformat()} while nothing ticked; caught up (policy "
            f"{job.options.catch_up})"
        )
        if skipped:
            reason += f"; skipped {len(skipped)} older dates"
    else:
        reason = f"scheduled at {fire.isoformat()}"
    if fresh:
        reason += f"; {NO_RECORD}"
    return runs.record_decision(run_id, "catch_up" if late else "create", reason)


def _next_fire_note(path: str, job: Job, now: datetime) -> str:
    """What a job's first tick that creates no run says: when it fires next, how to run now."""
    following: datetime = croniter(job.options.schedule, now.astimezone(job.zone)).get_next(
        datetime
    )
    return (
        f"no run due now (policy {job.options.catch_up}); the next fires at "
        f"{following:%Y-%m-%d %H:%M} {job.options.timezone}; to run one now: "
        f"redis-lease start {path}"
    )


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
    """Plans, finalizes or dispatches one open run; drops it when its record is gone."""
    try:
        info = runs.info(run_id)
    except NotFound:
        return [runs.drop_gone(job, run_id)]
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
    age_history.record(store, status, now_ms)
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
    need = capacity.run_need(
        capacity.measured_of(store, status),
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
    backs off (:func:`~redis_lease.backoff.hold_dispatch`); no burst is added while shard jobs fail.
    """
    opts = job.options
    run_id = status.run_id
    live = dispatch.live_jobs(store, run_id)  # counts the failed jobs it finds on the run
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
            dispatch.enqueue_shard(store, path, opts.queue, run_id, shard, opts.shard_budget)
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
    the unfinished items. Both come from :class:`~redis_lease.lease.RunStatus`.
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
        dispatch.enqueue_shard(store, path, opts.queue, run_id, shard, opts.shard_budget)
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
    (:func:`redis_lease.schedule.arm_next`), while the job's schedule is installed.
    Raises RedisLeaseError after the whole tick when some work failed, so the RQ
    job is marked failed; each failure is in its run's event log.
    """
    rq_job = get_current_job()
    if rq_job is None:
        raise RedisLeaseError("tick_entry runs inside an RQ worker; call tick() directly")
    store = LeaseStore(rq_job.connection, prefix=prefix)
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
