"""Operator views of runs and items: runs, items, dead, inspect; resolve-effect.

Each reads a bounded amount: ``items`` and ``dead`` print one page and the cursor of
the next (on stderr; ``next_cursor`` with ``--json``), ``inspect`` one item with its
effect records and attempts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..fleet.runs.run_states import RUN_STATES
from ..limits import ATTEMPTS_PAGE_SIZE, PAGE_MAX, PAGE_SIZE
from .app import app
from .options import ItemArg, JsonOpt, RunArg, json_option, open_store, parse_since

if TYPE_CHECKING:
    from ..operate.views import Page
    from ..protocol.leases import ItemRecord, RunStatus
    from ..protocol.store.lease_store import LeaseStore


LimitOpt = Annotated[
    int, typer.Option("--limit", "-n", help=f"Most items in the page (1-{PAGE_MAX}).")
]
CursorOpt = Annotated[
    str | None, typer.Option("--cursor", help="Where the page starts: the cursor a page printed.")
]


def _page_hint(page: Page, command: str) -> None:
    """The next page's command on stderr (stdout stays the rows), when there is one."""
    if page.next_cursor is not None:
        typer.echo(f"next page: {command} --cursor {page.next_cursor}", err=True)


# -- runs ---------------------------------------------------------------------


@app.command()
def runs(
    ctx: typer.Context,
    job: Annotated[str | None, typer.Option("--job", help="Only this job's runs.")] = None,
    state: Annotated[
        str | None,
        typer.Option("--state", help=f"Only runs in this state: {', '.join(RUN_STATES)}."),
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only runs created since: YYYY-MM-DD or ISO time.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", "-n", help=f"Most runs shown (1-{PAGE_MAX}).")
    ] = PAGE_SIZE,
    as_json: JsonOpt = False,
) -> None:
    """List runs, newest first: state, counts, failed shard jobs; paused jobs are named, and
    runs a loss touched (lost, or made again after one)."""
    from ..operate.cli_printing import print_json, print_table, progress_bar, same_times
    from ..operate.run_views import loss_text
    from ..operate.views import RunFilter

    wanted = RunFilter(job, state, limit)
    since_ms = parse_since(since, "--since") if since is not None else None
    store = open_store(ctx)
    candidates = wanted.candidates(store, since_ms)
    with progress_bar("reading runs", len(candidates)) as advance:
        shown = wanted.matching(store, _advancing(candidates, advance))
    paused = _paused_jobs(store, sorted({s.info["job"] for s in shown if s.info.get("job")}))
    if as_json:
        print_json([_run_row(s, paused) for s in shown])
        return
    if not shown:
        typer.echo("no runs")
    else:
        columns = ("run", "state", "planned", "done", "dead", "lost", "failed jobs", "created")
        print_table(columns, [_run_cells(s) for s in shown])
    for name, text in sorted(paused.items()):
        typer.echo(f"job {name} is {text}")
    for one in shown:
        loss = loss_text(one)
        if loss:
            typer.echo(f"run {one.run_id}: {same_times(loss)}")


def _advancing(run_ids: list[str], advance: Callable[[int], None]) -> Iterator[str]:
    """The run ids, advancing the progress bar as each is read."""
    for run_id in run_ids:
        advance(1)
        yield run_id


def _run_row(status: RunStatus, paused: dict[str, str]) -> dict[str, Any]:
    from ..fleet.transport.shard_job_failures import job_failures
    from ..operate.cli_printing import iso_time
    from ..operate.run_views import deadline_text, is_past_deadline, loss_text

    failures = job_failures(status.info)
    job = status.info.get("job")
    return {
        "run": status.run_id,
        "job": job,
        "state": status.state,
        "business_date": status.info.get("business_date"),
        "created_at": iso_time(int(status.info["created_at"]))
        if status.info.get("created_at", "").isdigit()
        else None,
        "deadline": deadline_text(status),
        "past_deadline": is_past_deadline(status),
        "counts": dict(status.counts),
        "planned": status.planned,
        "lost": status.lost,
        "failed_jobs": failures.count,
        "job_paused": paused.get(job) if job else None,
        "loss": loss_text(status),
    }


def _run_cells(status: RunStatus) -> list[Any]:
    from ..fleet.transport.shard_job_failures import job_failures
    from ..operate.cli_printing import iso_time
    from ..operate.run_views import state_text

    created = status.info.get("created_at", "")
    return [
        status.run_id,
        state_text(status),
        status.planned,
        status.counts["done"],
        status.counts["dead"],
        status.lost,
        job_failures(status.info).count,
        iso_time(int(created)) if created.isdigit() else None,
    ]


def _paused_jobs(store: LeaseStore, names: list[str]) -> dict[str, str]:
    """The paused ones among the jobs, each with who paused it and when (one round trip)."""
    from ..fleet.tick.schedule import pause_states
    from ..operate.cli_printing import iso_time

    if not names:
        return {}
    return {
        name: f"paused by {pause.by} at {iso_time(pause.at_ms)}"
        for name, pause in pause_states(store, names).items()
    }


# -- items and dead items ---------------------------------------------------------


@app.command()
def items(
    ctx: typer.Context,
    run: RunArg,
    state: Annotated[
        str | None, typer.Option("--state", help="pending, leased, done or dead (default: all).")
    ] = None,
    limit: LimitOpt = PAGE_SIZE,
    cursor: CursorOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One page of a run's items (by state from its index; all states by a scan)."""
    from ..operate.cli_printing import iso_time, print_json, print_table
    from ..operate.run_views import record_dict
    from ..operate.views import SCORE_MEANING, check_page, items_page

    check_page(run, state, limit)  # the view's checks, before connecting
    page = items_page(open_store(ctx), run, state, limit, cursor)
    meaning = SCORE_MEANING.get(state or "", "")
    if as_json:
        rows = []
        for record, at in zip(page.records, page.times_ms, strict=True):
            row = record_dict(record)
            if meaning:
                row[meaning] = iso_time(at)
            rows.append(row)
        print_json({"run": run, "state": state, "items": rows, "next_cursor": page.next_cursor})
        return
    columns = ["item", "state", "attempts", "token", "owner", *([meaning] if meaning else [])]
    print_table(
        (*columns, "error"),
        [
            [r.item_id, r.state, r.attempts, r.token, r.owner]
            + ([iso_time(at)] if meaning else [])
            + [r.error]
            for r, at in zip(page.records, page.times_ms, strict=True)
        ],
        title=f"{state or 'all'} items of run {run}",
    )
    option = f" --state {state}" if state else ""
    _page_hint(page, f"redis-lease items {run}{option} --limit {limit}")


@app.command()
def dead(
    ctx: typer.Context,
    run: RunArg,
    limit: LimitOpt = PAGE_SIZE,
    cursor: CursorOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Dead items, oldest death first, with their last errors; requeue them with requeue."""
    from ..operate.cli_printing import iso_time, print_json, print_table
    from ..operate.views import check_page, items_page

    check_page(run, "dead", limit)  # the view's checks, before connecting
    page = items_page(open_store(ctx), run, "dead", limit, cursor)
    if as_json:
        rows = [
            {
                "item": r.item_id,
                "attempts": r.attempts,
                "dead_at": iso_time(at),
                "error": r.error,
                "errors": _errors(r),
            }
            for r, at in zip(page.records, page.times_ms, strict=True)
        ]
        print_json({"run": run, "items": rows, "next_cursor": page.next_cursor})
        return
    if not page.records:
        typer.echo(f"run {run}: no dead items")
        return
    print_table(
        ("item", "attempts", "dead at", "last error"),
        [
            (r.item_id, r.attempts, iso_time(at), r.error)
            for r, at in zip(page.records, page.times_ms, strict=True)
        ],
        title=f"dead items of run {run}",
    )
    _page_hint(page, f"redis-lease dead {run} --limit {limit}")


def _errors(record: ItemRecord) -> list[dict[str, Any]]:
    """The item's last errors, oldest first, each with its attempt, time and trace id."""
    return [error.to_dict() for error in record.errors]


# -- one item -----------------------------------------------------------------


@app.command()
def inspect(
    ctx: typer.Context,
    run: RunArg,
    item: ItemArg,
    attempts_limit: Annotated[
        int, typer.Option("--attempts", help=f"Most attempts shown, newest first (1-{PAGE_MAX}).")
    ] = ATTEMPTS_PAGE_SIZE,
    as_json: JsonOpt = False,
) -> None:
    """One item: its record, its effect records and its attempts (with their trace ids)."""
    from ..errors import InvalidInput
    from ..operate.cli_printing import print_fields, print_json, print_table
    from ..operate.run_views import attempt_rows, effect_row, record_dict
    from ..operate.views import item_effects
    from ..protocol.validation import check_id

    check_id(run, "run id")
    check_id(item, "item id")
    if not 1 <= attempts_limit <= PAGE_MAX:
        raise InvalidInput(f"--attempts {attempts_limit} out of range: 1 to {PAGE_MAX}")
    store = open_store(ctx)
    record = store.item(run, item)
    effects = item_effects(store, run, item)
    attempts = attempt_rows(store, run, item, attempts_limit)
    data = record_dict(record)
    if as_json:
        print_json(
            {
                **data,
                "errors": _errors(record),
                "effects": [{"key": key, **effect_row(rec)} for key, rec in effects],
                "attempt_log": attempts,
            }
        )
        return
    print_fields(data, title=f"item {item} of run {run}")
    if effects:
        print_table(
            ("key", "effect", "state", "token", "updated", "result or error"),
            [
                (
                    key,
                    rec.get("name"),
                    rec.get("state"),
                    rec.get("token"),
                    effect_row(rec)["updated_at"],
                    rec.get("result", rec.get("error")),
                )
                for key, rec in effects
            ],
            title="effects",
            keep=("key",),
        )
    else:
        typer.echo("effects: none recorded")
    if attempts:
        print_table(
            ("at", "attempt", "event", "token", "worker", "error", "trace id"),
            [
                (
                    a["at"],
                    a["attempt"],
                    a["event"],
                    a["token"],
                    a["worker"],
                    a["error"],
                    a["trace_id"],
                )
                for a in attempts
            ],
            title="attempts (newest first)",
            keep=("trace id", "worker"),
        )
    else:
        typer.echo("attempts: none recorded")


@app.command("resolve-effect")
def resolve_effect_command(
    ctx: typer.Context,
    run: RunArg,
    item: ItemArg,
    effect: Annotated[str, typer.Argument(help="The effect's name, e.g. pay.")],
    applied: Annotated[
        str | None,
        typer.Option("--applied", help="It was applied: the provider's result (JSON, @FILE)."),
    ] = None,
    not_applied: Annotated[
        bool, typer.Option("--not-applied", help="The provider did nothing: send it again.")
    ] = False,
    worker: Annotated[
        str, typer.Option("--worker", "-w", help="Who resolves it (an id), recorded.")
    ] = "operator",
    as_json: JsonOpt = False,
) -> None:
    """Resolve an effect of unknown outcome with what the provider says (asked by its key)."""
    from ..errors import InvalidInput
    from ..fleet.effects.ledger import check_resolve, resolve_effect
    from ..operate.cli_printing import print_json
    from ..operate.run_views import effect_row

    check_resolve(run, item, effect, worker)  # the library's checks, before connecting
    if (applied is None) == (not not_applied):
        raise InvalidInput("say what the provider answered: --applied RESULT or --not-applied")
    result = json_option(applied, "result") if applied is not None else None
    record = resolve_effect(
        open_store(ctx),
        run,
        item,
        effect,
        applied=applied is not None,
        result=result,
        worker=worker,
    )
    if as_json:
        print_json({"run": run, "item": item, "effect": effect, **effect_row(record)})
    else:
        typer.echo(f"effect {effect} of {item} in run {run}: {record.get('state')}")
