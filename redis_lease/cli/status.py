"""Operator views: ``status`` of a run or of every run; ``wait`` for a run to end; ``workers``.

A run's status: counts, accounting (lost items, late commits), deadline and projected
finish, failed shard jobs, effects by outcome, the providers' caps, its decisions and
the dangers to the promise (an evicting Redis). Every run: a lost run in the state
``lost``, and the data set's last loss (:mod:`redis_lease.fleet.loss.data_set_mark`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .app import app
from .options import JsonOpt, RunArg, open_store

if TYPE_CHECKING:
    from ..operate.worker_views import WorkerRow
    from ..protocol.leases import RunStatus
    from ..protocol.store.lease_store import LeaseStore


def _status_row(status: RunStatus) -> list[Any]:
    from ..operate.run_views import state_text

    counts = status.counts
    return [
        status.run_id,
        state_text(status),
        status.shards,
        counts["pending"],
        counts["leased"],
        counts["done"],
        counts["dead"],
        status.lost,
        f"{status.oldest_eligible_age_seconds:.1f}",
    ]


def _loss_fields(info: dict[str, str]) -> dict[str, Any]:
    """The fields of a run a loss touched (none for any other run)."""
    from ..operate.cli_printing import same_times

    if not info.get("after_loss"):
        return {}
    fields: dict[str, Any] = {"after a loss": same_times(info["after_loss"])}
    if _replanned(info) is not None:
        fields["re-planned items"] = _replanned(info)
    return fields


def _replanned(info: dict[str, str]) -> int | None:
    """Items a re-run after a loss planned again (None for a run that is no re-run)."""
    text = info.get("replanned_items", "")
    return int(text) if text.isdigit() else None


@app.command()
def status(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Argument(help="Run id; omit to list every run.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Counts and ages of a run, or of every run; dangers to the promise (an evicting Redis)."""
    from ..fleet.loss.data_set_mark import read_mark
    from ..fleet.runs.run_states import LOST_STATE
    from ..operate.cli_printing import print_json, print_table, progress_bar, same_times
    from ..operate.views import run_statuses
    from ..protocol.connection.server_checks import eviction_danger
    from ..protocol.validation import check_id

    if run is not None:
        check_id(run, "run id")
    store = open_store(ctx)
    with store.translating_errors():
        danger = eviction_danger(store.client)
    dangers = [danger] if danger else []
    if run is not None:
        _one_run(store, run, dangers, as_json)
        return
    statuses: list[RunStatus] = []
    run_ids = store.run_ids()
    with progress_bar("reading runs", len(run_ids)) as advance:

        def counted() -> Iterator[str]:
            for run_id in run_ids:
                advance(1)
                yield run_id

        statuses += run_statuses(store, counted())  # a lost run is shown lost
    if as_json:
        print_json([s.to_dict() for s in statuses])
        return
    if not statuses:
        typer.echo("no runs")
    else:
        columns = ("run", "state", "shards", "pending", "leased", "done", "dead", "lost")
        print_table((*columns, "oldest due (s)"), [_status_row(s) for s in statuses])
    for one in statuses:
        if one.state == LOST_STATE:
            typer.echo(f"run {one.run_id} was {same_times(one.info.get('reason', 'lost'))}")
    mark = read_mark(store)
    if mark is not None and mark.last_loss:
        typer.echo(
            f"data set: {_last_loss(mark.last_loss, mark.last_loss_at_ms, mark.last_loss_reason)}"
        )
    for line in dangers:
        typer.echo(f"danger: {line}")


def _last_loss(kind: str, at_ms: int, reason: str) -> str:
    """The data set's last loss in one line."""
    from ..operate.cli_printing import iso_time

    return f"last loss ({kind}) noticed {iso_time(at_ms)}: {reason}"


def _one_run(store: LeaseStore, run: str, dangers: list[str], as_json: bool) -> None:
    """``status RUN``: the run's fields, decisions, effects, providers and dangers."""
    from ..errors import NotFound
    from ..fleet.runs.lifecycle import Runs
    from ..fleet.runs.run_states import LOST_HINT, OPEN_STATES
    from ..fleet.transport.shard_job_failures import job_failures
    from ..operate.cli_printing import print_fields, print_json, print_table, same_times
    from ..operate.run_views import (
        deadline_text,
        effects_by_outcome,
        is_past_deadline,
        loss_text,
        projected_finish_text,
        provider_rows,
        run_details,
        state_text,
    )
    from ..operate.views import providers

    try:
        one = store.status(run)
    except NotFound as error:  # gone (evidence it existed) or never there: exit 5 either way
        raise Runs(store).gone(run) or error from None
    decisions, settings = run_details(store, one)
    failures = job_failures(one.info)
    effects = effects_by_outcome(one)
    gates = provider_rows(providers(store))
    info = one.info
    deadline = deadline_text(one)
    if as_json:
        print_json(
            {
                **one.to_dict(),
                "deadline": deadline,
                "past_deadline": is_past_deadline(one),
                "projected_finish": projected_finish_text(one),
                "failed_jobs": failures.count,
                "last_job_error": failures.last_error or None,
                "effects": effects,
                "providers": gates,
                "decisions": decisions,
                "job_settings": settings,
                "loss": loss_text(one),
                "replanned_items": _replanned(info),
                "dangers": dangers,
            }
        )
        return
    lost_hint = f" ({LOST_HINT})" if one.lost else ""
    failed = f"{failures.count} (last: {failures.last_error})" if failures else "0"
    print_fields(
        {
            "state": state_text(one),
            "reason": same_times(info["reason"]) if info.get("reason") else None,
            "job": info.get("job"),
            "business date": info.get("business_date"),
            "deadline": deadline,
            "rate (items/s)": _rate_text(one),
            "recent rate (items/s)": (
                info.get("rate_per_s", "- (no sample yet)") if one.state in OPEN_STATES else None
            ),
            "projected finish": projected_finish_text(one),
            "shards": one.shards,
            "planned": one.planned,
            **one.counts,
            "total": one.total,
            "lost": f"{one.lost}{lost_hint}",
            "committed after the deadline": one.late,
            "failed shard jobs": failed,
            **_loss_fields(info),
            "oldest eligible age (s)": f"{one.oldest_eligible_age_seconds:.1f}",
            "oldest leased age (s)": f"{one.oldest_leased_age_seconds:.1f}",
            **{f"effects {name}": value for name, value in effects.items()},
            **{
                f"events.{name}": value
                for name, value in sorted(one.counters.items())
                if not name.startswith("effects_")
            },
        },
        title=f"run {run}",
    )
    if decisions:
        print_table(
            ("at", "decision", "reason"),
            [(d.get("at"), d.get("kind"), d.get("reason")) for d in decisions],
            title="decisions",
        )
    if gates:
        print_table(
            ("provider", "cap", "in use", "min-max", "throttles"),
            [
                (
                    g["provider"],
                    g["cap"],
                    g["in_use"],
                    f"{g['min_cap']}-{g['max_cap']}",
                    g["throttles"],
                )
                for g in gates
            ],
            title="providers",
            keep=("provider",),
        )
    for line in dangers:
        typer.echo(f"danger: {line}")


def _rate_text(status: RunStatus) -> str:
    """The run's own rate for people (:func:`~redis_lease.operate.run_views.run_rate`)."""
    from ..operate.run_views import run_rate

    rate = run_rate(status)
    return "-" if rate is None else f"{rate:.3g}"


@app.command()
def workers(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the worker processes: host, pid, heartbeat age, shard jobs and leases held.

    A worker whose heartbeat stopped is shown dead, with the leases taken over from
    it (its items went back to work: docs/durability.md, "A worker dies"). The jobs each
    worker was given to tick (--job) are listed, the tick leader is marked, and each
    declared job no leader ticks is named with why, in a danger line under the table.
    """
    from ..operate.cli_printing import iso_time, print_json, print_table
    from ..operate.worker_views import worker_rows
    from ..protocol.store.declared_jobs import declared_jobs

    store = open_store(ctx)
    fleet = declared_jobs(store)
    rows = worker_rows(store, fleet)
    if as_json:
        print_json([row.to_dict() for row in rows])
        return
    print_table(
        (
            "worker",
            "state",
            "host",
            "pid",
            "beat age s",
            "shard jobs",
            "leases held",
            "taken over",
            "jobs",
        ),
        [_worker_row(row) for row in rows],
        keep=("worker",),
    )
    if fleet.leader:
        since = iso_time(fleet.since_ms)
        typer.echo(
            f"tick leader: {fleet.leader}, token {fleet.token}"
            + (f", since {since}" if since else "")
        )
    for job in fleet.unticked:
        typer.echo(
            f"danger: job {job.job} ({job.path}), declared by worker {', '.join(job.workers)}, "
            f"is not ticked: {job.reason}"
        )


def _worker_row(row: WorkerRow) -> list[Any]:
    from ..operate.cli_printing import iso_time

    jobs = ", ".join(f"{job['run']}#{job['shard']}" for job in row.shard_jobs)
    taken = ", ".join(f"{t['leases']} of {t['run']}#{t['shard']}" for t in row.taken_over)
    unticked = {job["job"] for job in row.unticked_jobs}
    declared = [f"{name}{' (not ticked)' if name in unticked else ''}" for name in row.jobs]
    ticks = ", ".join(declared)
    if row.tick_leader:
        since = iso_time(row.tick_leader_since_ms)
        lead = f"tick leader (token {row.tick_leader_token}{f', since {since}' if since else ''})"
        ticks = f"{lead}: {ticks}" if ticks else lead
    return [
        row.name,
        row.state,
        row.host or None,
        row.pid,
        None if row.beat_age_s is None else f"{row.beat_age_s:.1f}",
        jobs or None,
        row.leases_held,
        f"{row.leases_taken_over} leases ({taken})" if row.taken_over else None,
        ticks or None,
    ]


#: Seconds between two reads of the run's state while ``wait`` waits.
WAIT_INTERVAL = 0.5


@app.command()
def wait(
    ctx: typer.Context,
    run: RunArg,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", metavar="SECONDS", help="Give up after this long (exit 12)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait until the run is final; print its final state and counts.

    Exit 0 when it succeeded, 11 when it ended partial, failed or canceled, 12 when
    --timeout passed first (the line names the state it was in).
    """
    import math
    import time

    from ..errors import InvalidInput, NotFound
    from ..fleet.runs.lifecycle import Runs
    from ..fleet.runs.run_states import FINAL_STATES, accounting
    from ..limits import SUCCEEDED
    from ..operate.cli_printing import error_line, print_json
    from ..protocol.validation import check_id
    from .options import RUN_NOT_SUCCEEDED_EXIT, WAIT_TIMED_OUT_EXIT

    check_id(run, "run id")
    if timeout is not None and not (math.isfinite(timeout) and timeout >= 0):
        raise InvalidInput(f"invalid --timeout {timeout:g}: use a number of seconds, 0 or more")
    store = open_store(ctx)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            one = store.status(run)
        except NotFound as error:  # gone (evidence it existed) or never there: exit 5 either way
            raise Runs(store).gone(run) or error from None
        final = one.state in FINAL_STATES
        left = None if deadline is None else deadline - time.monotonic()
        if final or (left is not None and left <= 0):
            break
        time.sleep(WAIT_INTERVAL if left is None else min(WAIT_INTERVAL, left))
    if as_json:
        print_json({**one.to_dict(), "timed_out": not final})
    if not final:
        error_line(
            f"timed out after {timeout:g} s: run {run} is still {one.state} ({accounting(one)})"
        )
        raise typer.Exit(WAIT_TIMED_OUT_EXIT)
    if not as_json:
        typer.echo(f"run {run} {one.state}: {accounting(one)}")
    if one.state != SUCCEEDED:
        raise typer.Exit(RUN_NOT_SUCCEEDED_EXIT)
