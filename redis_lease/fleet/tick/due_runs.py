"""Creating a job's due runs: the schedule window, the catch-up policy, missed dates.

The tick (:mod:`redis_lease.tick`) calls :func:`create_due_runs` for each job; what a
skipped date counts is in :mod:`redis_lease.fleet.tick.missed_runs`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from croniter import croniter

from ...protocol.store.lease_store import LeaseStore
from ..jobs.job import Job, business_date
from ..loss import lost_runs
from ..loss.data_set_mark import Observation
from ..runs.lifecycle import Decision, Runs, to_ms
from . import missed_runs

#: Said when a job has no record of any run on the server.
NO_RECORD = (
    "no record of this job's runs on the server: a new job, or the server lost its data "
    "(check persistence)"
)


def create_due_runs(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    now: datetime,
    first: bool,
    seen: Observation | None = None,
) -> list[Decision]:
    """Creates the runs that are due, by the job's definition and its record on the server.

    The window is the job's ``catch_up_days`` back from now, after the last
    scheduled time a tick handled (``last_fire_at``), else after the newest run's
    creation less ``catch_up_grace_seconds``. With no record of the job's runs at all (a
    new job, or a server that lost its data) the due run is the latest scheduled
    time in the window, and it is on time while its deadline is ahead (whatever
    the policy: the server lost it, nothing missed it). The catch-up policy then
    picks: ``all`` missed dates, the ``latest``, or ``none`` but those on time
    (within ``catch_up_grace_seconds``). The dates it skips were missed, and so were those
    between ``last_fire_at`` and the window's start: each is counted once in the job's
    ``missed`` tally (``redis_lease_missed_runs_total``, :mod:`redis_lease.fleet.tick.missed_runs`),
    and a ``missed`` decision on the run created with them names them.

    After a loss of the data set (``seen``: this tick's look at the mark) the server may have
    no record of the job's runs while the scheduler remembers the last scheduled time its
    ticks handled: the window then begins after it, as if the server had kept it. When that
    memory is in doubt (another scheduler may have ticked since), the dates after it are
    named lost, not made: the tick cannot tell whether they ran.
    """
    opts = job.options
    grace = timedelta(seconds=opts.catch_up_grace_seconds)
    with store.translating_errors():
        record = _JobRecord.read(store, job)
    remembered = _remembered_fire(record, job, seen)
    if remembered is not None:
        fired, doubtful = remembered
        record = replace(record, last_fire=fired)
        if doubtful:
            return _name_in_doubt(store, runs, path, job, record, now)
        with store.translating_errors():  # first: a tick that stops later goes on from it
            store.client.hsetnx(store.keys.job(job.name), "last_fire_at", str(to_ms(fired)))
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


def _remembered_fire(
    record: _JobRecord, job: Job, seen: Observation | None
) -> tuple[datetime, bool] | None:
    """When the server has no last scheduled time of the job (a loss took it) and the
    scheduler remembers one: that time and whether that memory is in doubt; else None."""
    if record.last_fire is not None or seen is None:
        return None
    known = seen.remembered.fired.get(job.name) if seen.remembered else None
    if known is None:
        return None
    fired_ms, doubtful = known
    return datetime.fromtimestamp(fired_ms / 1000, job.zone), doubtful


def _name_in_doubt(
    store: LeaseStore, runs: Runs, path: str, job: Job, record: _JobRecord, now: datetime
) -> list[Decision]:
    """Names lost the dates scheduled after the last one a doubtful memory remembers handling
    (another scheduler may have run them), then moves the job's last scheduled time to now:
    a tick that stops midway leaves it unmoved, and the next names the rest."""
    since = record.last_fire or now
    # every date since, not only the catch-up window's: any of them may have had a run
    fires = job.fire_times(max(since, now - timedelta(days=lost_runs.IN_DOUBT_DAYS)), now)
    why = (
        "scheduled after the last date this tick side remembers handling, and another tick "
        "side may have ticked since; after a loss of the data set nothing shows whether it ran"
    )
    days = sorted({business_date(job, fire) for fire in fires})
    decisions = lost_runs.name_unknown_dates(store, runs, path, job, days, now, why)
    missed_runs.record_handled(store, job, fires, [], count=False)
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


__all__ = ["NO_RECORD", "create_due_runs"]
