"""Scheduled runs that were never created (missed): which dates, counting each once, and
the note a tick leaves about them.

A date is missed when the tick's catch-up policy skips it, or when it lies between the
last scheduled time a tick handled and the start of the catch-up window (nothing ticked
for longer than ``catch_up_days``): those older dates are counted too, at most
:data:`MAX_OLDER_DATES` a tick. Each missed date is counted once in the job's ``missed``
tally (:func:`redis_lease.fleet.runs.job_tallies.count_missed`); a date that has a run, or was
counted before, is not. Dates skipped while the schedule is paused are an operator's
choice: marked, not counted.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from croniter import croniter

from ...protocol.store.lease_store import LeaseStore
from ..jobs.job import Job, business_date
from ..runs import job_tallies
from ..runs.lifecycle import Decision, Runs, to_ms

#: The most dates older than the catch-up window counted in one tick (a year of a daily job).
MAX_OLDER_DATES = 366
#: The most scheduled times looked at to find them (a year of an hourly job).
MAX_OLDER_FIRES = 366 * 24


def older_dates(job: Job, handled: datetime | None, window_start: datetime) -> list[str]:
    """The business dates (ISO, oldest first) of the scheduled times after ``handled`` (the
    last one a tick handled) up to ``window_start`` (the catch-up window begins after it):
    the newest :data:`MAX_OLDER_DATES`, from at most :data:`MAX_OLDER_FIRES` times."""
    if handled is None or handled >= window_start:
        return []
    base = window_start.astimezone(job.zone) + timedelta(seconds=1)
    itr = croniter(job.options.schedule, base)
    days: set[str] = set()
    for _ in range(MAX_OLDER_FIRES):
        fire: datetime = itr.get_prev(datetime)
        if fire <= handled:
            break
        if fire <= window_start:
            days.add(business_date(job, fire).isoformat())
            if len(days) >= MAX_OLDER_DATES:
                break
    return sorted(days)


def record_handled(
    store: LeaseStore,
    job: Job,
    fires: list[datetime],
    skipped: list[datetime],
    why: str | None = None,
    older: list[str] | None = None,
    count: bool = True,
) -> list[str]:
    """Moves ``last_fire_at`` to the newest scheduled time seen; marks skipped dates.

    Dates skipped by the catch-up policy (``why`` None, with ``count``) and the
    ``older`` dates were missed: those not marked before are counted in the job's
    ``missed`` tally and returned. Dates skipped while paused (``why`` says so) are
    marked, not counted. Returns the dates counted as missed now.
    """
    days = sorted({business_date(job, fire).isoformat() for fire in skipped})
    counted = why is None and count
    missing = sorted({*days, *(older or [])})
    missed = job_tallies.count_missed(store, job.name, missing) if counted else []
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        if fires:
            pipe.hset(store.keys.job(job.name), "last_fire_at", str(to_ms(fires[-1])))
        if days and not counted:  # else count_missed marked them
            pipe.zadd(store.keys.job_dates(job.name), dict.fromkeys(days, 0), nx=True)
        if days:
            note = f"skipped {len(days)} missed dates ({why or f'policy {job.options.catch_up}'}): "
            pipe.hset(store.keys.job(job.name), "last_catch_up", note + ", ".join(days))
        pipe.execute()
    return missed


def missed_decision(runs: Runs, path: str, job: Job, run_id: str, days: list[str]) -> Decision:
    """Records, on the run just created, the scheduled dates that got no run."""
    reason = (
        f"{len(days)} scheduled runs never created (missed while nothing ticked; policy "
        f"{job.options.catch_up}): {', '.join(days)}; to make them: redis-lease backfill "
        f"{path} --from {days[0]} --to {days[-1]}"
    )
    return runs.record_decision(run_id, "missed", reason)


def skip_paused(
    store: LeaseStore, job: Job, paused_by: str, fires: list[datetime], todo: list[datetime]
) -> list[Decision]:
    """A paused job's tick: its due dates are skipped (``backfill`` can make them later)."""
    record_handled(store, job, fires, todo, f"while paused by {paused_by}")
    if not todo:
        return []
    days = ", ".join(sorted({business_date(job, fire).isoformat() for fire in todo}))
    return [
        Decision(
            "paused",
            job.name,
            f"schedule paused by {paused_by}: no run created for {days}; "
            f"redis-lease schedule resume {job.name} to create new runs again, "
            "redis-lease backfill to make these",
        )
    ]


__all__ = [
    "MAX_OLDER_DATES",
    "business_date",
    "missed_decision",
    "older_dates",
    "record_handled",
    "skip_paused",
]
