"""Operator views: ``status`` of a run (counts, accounting, decisions, dangers) or of every run."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..connection import as_text, eviction_danger
from ..errors import NotFound
from ..lease import RunStatus
from ..output import print_fields, print_json, print_table
from ..runs import Runs
from ..store import LeaseStore
from ..validation import check_id
from .app import (
    JsonOpt,
    app,
    iso_ms,
    open_store,
)


def run_details(
    store: LeaseStore, status: RunStatus
) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The run's recorded decisions and its job's recorded settings (empty for ad-hoc runs)."""
    decisions = Runs(store).events(status.run_id)
    job = status.info.get("job")
    settings: dict[str, str] = {}
    if job:
        with store.errors(status.run_id):
            raw = store.client.hgetall(store.keys.job(job))
        settings = {as_text(k): as_text(v) for k, v in raw.items()}
    return decisions, settings


def _status_row(status: RunStatus) -> list[Any]:
    counts = status.counts
    return [
        status.run_id,
        status.state,
        status.shards,
        counts["pending"],
        counts["leased"],
        counts["done"],
        counts["dead"],
        status.lost,
        f"{status.oldest_eligible_age_seconds:.1f}",
    ]


@app.command()
def status(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Argument(help="Run id; omit to list every run.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Counts and ages of a run, or of every run; dangers to the promise (an evicting Redis)."""
    if run is not None:
        check_id(run, "run id")
    store = open_store(ctx)
    with store.errors():
        danger = eviction_danger(store.client)
    dangers = [danger] if danger else []
    if run is not None:
        try:
            one = store.status(run)
        except NotFound as error:  # gone (evidence it existed) or never there: exit 5 either way
            raise Runs(store).gone(run) or error from None
        decisions, settings = run_details(store, one)
        if as_json:
            print_json(
                {
                    **one.to_dict(),
                    "decisions": decisions,
                    "job_settings": settings,
                    "dangers": dangers,
                }
            )
            return
        info = one.info
        print_fields(
            {
                "state": one.state,
                "reason": info.get("reason"),
                "job": info.get("job"),
                "business date": info.get("business_date"),
                "deadline": iso_ms(int(info["deadline_at"])) if info.get("deadline_at") else None,
                "rate (items/s)": info.get("rate_per_s"),
                "projected finish": iso_ms(int(info["projected_finish_at"]))
                if info.get("projected_finish_at")
                else None,
                "shards": one.shards,
                "planned": one.planned,
                **one.counts,
                "total": one.total,
                "lost": one.lost,
                "committed after the deadline": one.late,
                "oldest eligible age (s)": f"{one.oldest_eligible_age_seconds:.1f}",
                "oldest leased age (s)": f"{one.oldest_leased_age_seconds:.1f}",
                **{f"events.{name}": value for name, value in sorted(one.events.items())},
            },
            title=f"run {run}",
        )
        if decisions:
            print_table(
                ("at", "decision", "reason"),
                [
                    (iso_ms(int(d.get("at", "0"))), d.get("kind"), d.get("reason"))
                    for d in decisions
                ],
                title="decisions",
            )
        for line in dangers:
            typer.echo(f"danger: {line}")
        return
    statuses: list[RunStatus] = []
    for run_id in store.run_ids():
        try:
            statuses.append(store.status(run_id))
        except NotFound:  # listed, but its record has expired since
            continue
    if as_json:
        print_json([s.to_dict() for s in statuses])
        return
    if not statuses:
        typer.echo("no runs")
    else:
        columns = ("run", "state", "shards", "pending", "leased", "done", "dead", "lost")
        print_table((*columns, "oldest due (s)"), [_status_row(s) for s in statuses])
    for line in dangers:
        typer.echo(f"danger: {line}")
