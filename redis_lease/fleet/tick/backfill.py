"""Backfill: the runs of a range of past business dates, made on an operator's request.

Dates are those on which the job's schedule fires, in its timezone; a date whose
scheduled start has not come yet (by the server's clock) is refused, since the
tick makes that run when it is due. The next tick plans and dispatches the runs.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta

from ...errors import InvalidInput
from ...limits import BACKFILL_DAYS_MAX
from ...protocol.store.lease_store import LeaseStore
from ..jobs.job import Job, business_date
from ..runs.lifecycle import Decision, Runs

BACKFILL_POLICIES = ("all", "latest")
#: The most business dates one backfill spans.
BACKFILL_MAX_DAYS = BACKFILL_DAYS_MAX
#: How far back the last date allowed is looked for (a job may fire once in four years).
_LOOKBACK_DAYS = 4 * 366


def backfill_dates(job: Job, first: date, last: date) -> list[date]:
    """The business dates in ``first``..``last`` (inclusive) on which the job's schedule
    fires, in its timezone, oldest first; each date once, whatever daylight saving does."""
    if last < first:
        raise InvalidInput(f"--to {last} is before --from {first}")
    if (last - first).days >= BACKFILL_MAX_DAYS:
        raise InvalidInput(f"a backfill spans at most {BACKFILL_MAX_DAYS} days; split the range")
    since = datetime.combine(first, time(0), job.zone) - timedelta(microseconds=1)
    until = datetime.combine(last + timedelta(days=1), time(0), job.zone) - timedelta(
        microseconds=1
    )
    return sorted({business_date(job, fire) for fire in job.fire_times(since, until)})


def last_allowed(job: Job, now: datetime) -> date | None:
    """The newest business date whose scheduled start is not after ``now`` (None if none
    within four years)."""
    day = now.astimezone(job.zone).date()
    for _ in range(_LOOKBACK_DAYS):
        start = job.scheduled_start(day)
        if business_date(job, start) == day and start <= now:
            return day
        day -= timedelta(days=1)
    return None


def check_due(job: Job, dates: list[date], last: date, now: datetime) -> None:
    """Refuses a range (to ``last``) holding a date whose scheduled start is after ``now``.

    Raises:
        InvalidInput: naming the first such date and the last date allowed.
    """
    early = [day for day in dates if job.scheduled_start(day) > now]
    if not early:
        return
    allowed = last_allowed(job, now)
    limit = f"the last date allowed is {allowed}" if allowed else "no scheduled date has come yet"
    scheduled = job.scheduled_start(early[0]).isoformat()
    raise InvalidInput(
        f"--to {last} is too late: {early[0]} is scheduled at {scheduled}, after the "
        f"server's now; {limit} (the tick makes later runs when they are due)"
    )


def full_window(job: Job, day: date) -> timedelta:
    """A business date's window: from its scheduled start to its deadline."""
    scheduled = job.scheduled_start(day)
    return job.deadline_for(day, scheduled) - scheduled


def deadline_starting_now(job: Job, day: date, now: datetime) -> tuple[datetime, bool]:
    """The deadline of a run an operator starts ``now``, and whether it was moved.

    The date's own deadline while it is ahead; once it has passed (a past date, or
    today after a ``deadline_at`` clock time), the date's full window from now, as
    :func:`backfill` gives, so the run is not failed before any work.
    """
    own = job.deadline_for(day, now)
    if own > now:
        return own, False
    return now + full_window(job, day), True


def backfill(
    store: LeaseStore,
    job: Job,
    first: date,
    last: date,
    policy: str = "all",
    now: datetime | None = None,
) -> list[Decision]:
    """Creates the job's runs of the scheduled dates from ``first`` to ``last``.

    ``all`` creates a run for every scheduled date in the range, ``latest`` only
    for the newest (as Temporal's schedule backfill overlap and catch-up
    policies do: every missed action, or the most recent). Idempotent: a date
    that has a run is left alone, so a second backfill creates nothing. Each
    run gets its full window from now (its deadline moves with its start, as
    for a late run). The next tick (``redis-lease backfill`` runs one) plans
    and dispatches the runs.

    Raises:
        InvalidInput: an unknown policy, a range that is reversed or too long, or
            one holding a date whose scheduled start is after ``now`` (default:
            the server's clock). Nothing is written then.
    """
    if policy not in BACKFILL_POLICIES:
        raise InvalidInput(f"unknown policy {policy!r}: use {' or '.join(BACKFILL_POLICIES)}")
    dates = backfill_dates(job, first, last)
    runs = Runs(store)
    moment = now or runs.server_now()
    check_due(job, dates, last, moment)
    if policy == "latest":
        dates = dates[-1:]
    decisions: list[Decision] = []
    for day in dates:
        scheduled = job.scheduled_start(day)
        run_id, created = runs.ensure(job, day, moment, moment + full_window(job, day))
        if created:
            reason = (
                f"backfilled (policy {policy}, {first} to {last}); scheduled for "
                f"{scheduled.isoformat()}"
            )
            decisions.append(runs.record_decision(run_id, "backfill", reason))
    return decisions
