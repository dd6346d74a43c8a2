"""Schedule commands: install, show and remove the tick's entries, pause and resume a
job's schedule, and backfill a range of business dates."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from .app import app
from .help_text import ReadableTyper
from .options import JsonOpt, exit_if_failed, open_store, parse_date, planning_progress

if TYPE_CHECKING:
    from ..fleet.tick.schedule import Pause


JobArg = Annotated[str, typer.Argument(help="A job's import path, package.module:attr.")]
JobNameArg = Annotated[
    str, typer.Argument(help="A job's import path (package.module:attr) or its name.")
]

schedule_app = ReadableTyper(
    help="The job's schedule: rq-scheduler entries, pause and resume.", no_args_is_help=True
)
app.add_typer(schedule_app, name="schedule")


@schedule_app.command("install")
def schedule_install(
    ctx: typer.Context,
    job_path: JobArg,
    interval: Annotated[
        int, typer.Option("--interval", min=10, help="Seconds between ticks.")
    ] = 60,
    as_json: JsonOpt = False,
) -> None:
    """Register the job's ticks: every INTERVAL seconds, and at each scheduled time.

    The scheduled times are the job's cron schedule in its own timezone (daylight
    saving included); each tick arms the next one. Run the scheduler with:
    rqscheduler --url URL -j redis_lease.dispatch.JsonJob
    """
    from ..fleet.jobs.job import load_job
    from ..fleet.tick.schedule import install
    from ..operate.cli_printing import print_json

    job = load_job(job_path)
    ids = install(open_store(ctx, needs_rq=True), job_path, job, interval)
    if as_json:
        print_json({"job": job.name, "installed": ids, "queue": job.options.queue})
    else:
        typer.echo(f"installed {', '.join(ids)} on queue {job.options.queue}")


@schedule_app.command("show")
def schedule_show(ctx: typer.Context, job_path: JobArg, as_json: JsonOpt = False) -> None:
    """The job's tick entries with their next time in the job's timezone and UTC,
    its next scheduled time, and whether its schedule is paused (--json: the entries,
    each with the pause)."""
    from ..fleet.jobs.job import load_job
    from ..fleet.tick.schedule import entries, local_time, next_fire, pause_state
    from ..operate.cli_printing import print_json, print_table
    from ..protocol.connection.clients import server_ms
    from ..protocol.leases import from_ms

    job = load_job(job_path)
    store = open_store(ctx, needs_rq=True)
    rows = entries(store, job)
    paused = pause_state(store, job.name)
    with store.translating_errors():
        now_ms = server_ms(store.client)
    upcoming = next_fire(job, from_ms(now_ms))
    if as_json:
        print_json([{**row, "paused": _pause_json(paused)} for row in rows])
        return
    typer.echo(
        f"{job.name}: {job.options.schedule} in {job.options.timezone}; next "
        f"{local_time(upcoming, job)}; "
        + (paused.describe() + " (no new runs)" if paused else "not paused")
    )
    print_table(
        ("id", "next", "next (UTC)", "cron", "interval"),
        [
            (
                r["id"],
                r["next"],
                r["next_utc"],
                f"{r['cron']} {r['timezone']}".strip(),
                r["interval"],
            )
            for r in rows
        ],
    )


@schedule_app.command("next")
def schedule_next(
    job_path: JobArg,
    start: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="TIME",
            help="Start after this time: YYYY-MM-DD (midnight UTC) or ISO 8601 (UTC when it "
            "has no offset). Default: now, by this machine's clock.",
        ),
    ] = None,
    count: Annotated[int, typer.Option("--count", min=1, max=366, help="How many.")] = 5,
    as_json: JsonOpt = False,
) -> None:
    """The job's next scheduled times, and the run each makes when the tick is on time:
    its business date, run id and deadline. Reads no Redis: try a schedule, a timezone
    or a deadline before a night comes."""
    from datetime import UTC, datetime, timedelta

    from ..fleet.jobs.job import business_date, load_job
    from ..operate.cli_printing import print_json, print_table
    from ..protocol.leases import from_ms
    from .options import parse_since

    job = load_job(job_path)
    since = from_ms(parse_since(start, "--from")) if start else datetime.now(UTC)
    rows: list[dict[str, str]] = []
    after = since
    while len(rows) < count:
        fires = job.fire_times(after, after + timedelta(days=400))
        if not fires:
            break
        for fire in fires[: count - len(rows)]:
            day = business_date(job, fire)
            deadline = job.deadline_for(day, fire)
            rows.append(
                {
                    "business_date": day.isoformat(),
                    "run": job.run_id(day),
                    "fires": fire.isoformat(),
                    "fires_utc": fire.astimezone(UTC).isoformat(),
                    "deadline_utc": deadline.astimezone(UTC).isoformat(),
                }
            )
        after = fires[-1]
    if as_json:
        print_json(rows)
        return
    typer.echo(
        f"{job.name}: {job.options.schedule} in {job.options.timezone}, after "
        f"{since.astimezone(UTC).isoformat(timespec='seconds')}"
    )
    local = [] if job.options.timezone == "UTC" else [f"fires ({job.options.timezone})"]
    print_table(
        ("business date", "run", *local, "fires (UTC)", "deadline (UTC)"),
        [
            (
                r["business_date"],
                r["run"],
                *([r["fires"]] if local else []),
                r["fires_utc"],
                r["deadline_utc"],
            )
            for r in rows
        ],
    )


def _pause_json(paused: Pause | None) -> dict[str, object] | None:
    if paused is None:
        return None
    return {"by": paused.by, "at_ms": paused.at_ms, "text": paused.describe()}


@schedule_app.command("remove")
def schedule_remove(ctx: typer.Context, job_path: JobArg, as_json: JsonOpt = False) -> None:
    """Remove the job's tick entries."""
    from ..fleet.jobs.job import load_job
    from ..fleet.tick.schedule import remove
    from ..operate.cli_printing import print_json

    job = load_job(job_path)
    removed = remove(open_store(ctx, needs_rq=True), job)
    if as_json:
        print_json({"job": job.name, "removed": removed})
    else:
        typer.echo(f"removed {removed} entries")


def _job_name(ctx: typer.Context, job: str) -> str:
    """The job's name from its import path, or the name of a job a tick has seen."""
    from ..errors import NotFound
    from ..fleet.jobs.job import load_job
    from ..fleet.tick.schedule import job_names
    from ..protocol.validation import check_id

    if ":" in job:
        return load_job(job).name
    name = check_id(job, "job name")
    if name not in job_names(open_store(ctx)):
        raise NotFound(f"no job {name!r} is known here: give its import path, package.module:attr")
    return name


@schedule_app.command("pause")
def schedule_pause(
    ctx: typer.Context,
    job: JobNameArg,
    by: Annotated[
        str | None, typer.Option("--by", help="Who pauses it (default: the OS user).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop the tick creating new runs of the job; runs already made go on.

    Scheduled dates that pass while paused are skipped (backfill makes them).
    """
    from ..fleet.tick.schedule import default_user, pause
    from ..operate.cli_printing import print_json
    from ..protocol.validation import check_id

    who = check_id(by, "--by") if by is not None else default_user()
    name = _job_name(ctx, job)
    paused = pause(open_store(ctx), name, who)
    if as_json:
        print_json({"job": name, "paused": _pause_json(paused)})
    else:
        typer.echo(f"{name}: {paused.describe()}")


@schedule_app.command("resume")
def schedule_resume(ctx: typer.Context, job: JobNameArg, as_json: JsonOpt = False) -> None:
    """Let the tick create the job's runs again (from its next scheduled time)."""
    from ..fleet.tick.schedule import resume as resume_schedule
    from ..operate.cli_printing import print_json

    name = _job_name(ctx, job)
    ended = resume_schedule(open_store(ctx), name)
    if as_json:
        print_json({"job": name, "paused": None, "was": _pause_json(ended)})
    else:
        typer.echo(
            f"{name}: resumed" + (f" (was {ended.describe()})" if ended else " (not paused)")
        )


@app.command("backfill")
def backfill_command(
    ctx: typer.Context,
    job_path: JobArg,
    first: Annotated[str, typer.Option("--from", help="First business date, YYYY-MM-DD.")],
    last: Annotated[str, typer.Option("--to", help="Last business date, YYYY-MM-DD.")],
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            help="all: a run for every scheduled date in the range; latest: only for the newest "
            "(as Temporal's schedule backfill and catch-up policies: every missed action, or "
            "the most recent).",
        ),
    ] = "all",
    as_json: JsonOpt = False,
) -> None:
    """Create the runs of a range of business dates, then tick the job to plan and dispatch.

    Dates are those on which the job's schedule fires, in its timezone. Running it
    twice creates nothing new; a date that has a run is left alone. Exit 7 as for tick.
    """
    from ..errors import InvalidInput
    from ..fleet.jobs.job import load_job
    from ..fleet.tick.backfill import BACKFILL_POLICIES, backfill
    from ..operate.cli_printing import print_json, same_times

    if policy not in BACKFILL_POLICIES:
        raise InvalidInput(f"unknown --policy {policy!r}: use {' or '.join(BACKFILL_POLICIES)}")
    start, end = parse_date(first, "--from"), parse_date(last, "--to")
    job = load_job(job_path)
    store = open_store(ctx, needs_rq=True)
    created = backfill(store, job, start, end, policy)
    from ..fleet.tick.scheduler_tick import tick

    with planning_progress() as progress:
        decisions = tick(store, [job_path], progress=progress)
    if as_json:
        print_json(
            {
                "created": [d.run_id for d in created],
                "decisions": [
                    {"kind": d.kind, "run": d.run_id, "reason": d.reason}
                    for d in [*created, *decisions]
                ],
            }
        )
    else:
        typer.echo(f"{len(created)} runs created ({job.name}, {start} to {end}, policy {policy})")
        for decision in [*created, *decisions]:
            typer.echo(f"  {decision.kind} {decision.run_id}: {same_times(decision.reason)}")
    exit_if_failed(decisions, made=[d.run_id for d in created])
