"""Lease commands: add, claim, renew, commit, fail, release, reap, requeue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from ..limits import DEFAULT_MAX_ATTEMPTS, DEFAULT_SWEEP, DEFAULT_TTL
from .app import app
from .options import (
    ItemArg,
    JsonOpt,
    LeaseIdOpt,
    RunArg,
    TokenOpt,
    TraceIdOpt,
    TtlOpt,
    json_option,
    open_store,
)

if TYPE_CHECKING:
    from ..protocol.leases import Lease
    from ..protocol.store.lease_store import LeaseStore
    from .item_files import ItemFile


def _lease_ref(
    ctx: typer.Context, run: str, item: str, token: int, lease_id: str, trace_id: str = ""
) -> tuple[LeaseStore, Lease]:
    """The store and a Lease by token for a holder command; the store's checks of the ids
    run before it connects."""
    from ..protocol.store.call_checks import check_ref

    check_ref(run, item, token, lease_id, trace_id)
    store = open_store(ctx)
    return store, store.lease_ref(run, item, token, lease_id, trace_id)


# -- commands -----------------------------------------------------------------


@app.command()
def add(
    ctx: typer.Context,
    run: RunArg,
    items: Annotated[
        list[str] | None, typer.Argument(help="Item ids to add (or --from-file).")
    ] = None,
    from_file: Annotated[
        str | None,
        typer.Option(
            "--from-file",
            "-f",
            help="JSON lines or CSV of items (- for stdin), added in batches.",
        ),
    ] = None,
    file_format: Annotated[
        str, typer.Option("--format", help="auto, jsonl or csv (auto: by suffix, then content).")
    ] = "auto",
    payload: Annotated[
        str | None,
        typer.Option(
            "--payload", help="JSON payload of every item (given none by its line); @FILE reads it."
        ),
    ] = None,
    shards: Annotated[
        int | None, typer.Option("--shards", help="Shard count of a new run (default 1).")
    ] = None,
    max_attempts: Annotated[
        int, typer.Option("--max-attempts", help="Attempts before an item is dead.")
    ] = DEFAULT_MAX_ATTEMPTS,
    as_json: JsonOpt = False,
) -> None:
    """Add items to a run, creating the run; existing items are left as they are."""
    from ..errors import InvalidInput
    from ..operate.cli_printing import print_json
    from ..protocol.leases import Item
    from ..protocol.store.call_checks import check_add
    from .item_files import ItemFile

    if bool(items) == (from_file is not None):
        raise InvalidInput("name the items to add, or give --from-file FILE (not both)")
    check_add(run, items or [], shards=shards, max_attempts=max_attempts)  # before connecting
    if from_file == "-" and payload == "@-":
        raise InvalidInput("stdin cannot hold both the items and --payload: put one in a file")
    value = json_option(payload, "payload") if payload is not None else None
    if from_file is not None:
        added, existing = _add_from_file(
            ctx, run, ItemFile(from_file, file_format, value), shards, max_attempts
        )
    else:
        added_ids, existing_ids = open_store(ctx).add(
            run,
            [Item(item, value) for item in items or []],
            shards=shards,
            max_attempts=max_attempts,
        )
        added, existing = len(added_ids), len(existing_ids)
    data = {
        "run": run,
        "added": added,
        "existing": existing,
        "shards": open_store(ctx).shard_count(run),
    }
    if as_json:
        print_json(data)
    else:
        typer.echo(f"run {run}: {added} added, {existing} already there")


def _add_from_file(
    ctx: typer.Context, run: str, source: ItemFile, shards: int | None, max_attempts: int
) -> tuple[int, int]:
    """Adds the file's items after checking every line; returns the counts (an id given
    twice counts once as added, then as already there)."""
    from ..errors import RedisFull
    from ..operate.cli_printing import progress_bar

    with source.opened():  # every line checked first: a bad one writes nothing
        store = open_store(ctx)
        before = _items_by_shard(store, run)
        try:
            with progress_bar(f"adding to {run}", source.count) as advance:
                return store.add_checked(
                    run, source.items(), shards=shards, max_attempts=max_attempts, progress=advance
                )
        except RedisFull as error:
            raise RedisFull(
                f"{error.message}; {_went_in(store, run, before, source.count)}", run_id=run
            ) from None


def _items_by_shard(store: LeaseStore, run: str) -> list[int]:
    """The run's items in each shard now (none when the run does not exist); read without
    scripts, so that it answers on a full Redis too."""
    from ..errors import NotFound
    from ..protocol.accounting import COUNT_STATES

    try:
        shards = store.status_by_shard(run)[1]
        return [sum(counts.get(state, 0) for state in COUNT_STATES) for counts in shards]
    except NotFound:
        return []


def _went_in(store: LeaseStore, run: str, before: list[int], count: int) -> str:
    """What a full Redis let in of the file's ``count`` items before it refused, where, and
    how to go on."""
    from ..messages import count_of

    after = _items_by_shard(store, run)
    if not after:
        return f"none of the file's {count} items went in (run {run} was not made)"
    grown = [n for n, total in enumerate(after) if total > (before[n] if n < len(before) else 0)]
    went = sum(after) - sum(before)
    held = f"shard{'s' if len(grown) != 1 else ''} {', '.join(map(str, grown))}" if grown else ""
    return (
        f"{went} of the file's {count_of(count, 'item')} went in before it refused (run {run}"
        + (f", {held}" if held else "")
        + "); once memory is freed, the same command again adds the rest (adding is "
        "idempotent: items already there are left as they are)"
    )


@app.command()
def claim(
    ctx: typer.Context,
    run: RunArg,
    worker: Annotated[str, typer.Option("--worker", "-w", help="Who holds the lease (an id).")],
    item: Annotated[
        str | None, typer.Argument(help="Item id; omit for the next due item of any shard.")
    ] = None,
    ttl: TtlOpt = DEFAULT_TTL,
    as_json: JsonOpt = False,
) -> None:
    """Lease an item (or the next due one) and print its token."""
    from ..operate.cli_printing import compact_json, print_json
    from ..protocol.store.call_checks import check_claim

    check_claim(run, item, worker, ttl)  # the store's checks, before connecting
    store = open_store(ctx)
    if item is None:
        lease = store.claim_any(run, worker, ttl=ttl)
    else:
        lease = store.claim(run, item, worker, ttl=ttl)
    if as_json:
        print_json(lease.to_dict())
        return
    data = lease.to_dict()
    taken = ", taken over from an expired lease" if lease.takeover else ""
    typer.echo(
        f"claimed {lease.item_id} of run {run}: token {lease.token}, lease id "
        f"{lease.lease_id}, expires {data['expires_at']} (attempt {lease.attempt}{taken})"
    )
    if lease.payload is not None:
        typer.echo(f"payload: {compact_json(lease.payload)}")


@app.command()
def renew(
    ctx: typer.Context,
    run: RunArg,
    item: ItemArg,
    token: TokenOpt,
    lease_id: LeaseIdOpt = "",
    trace_id: TraceIdOpt = "",
    ttl: TtlOpt = DEFAULT_TTL,
    as_json: JsonOpt = False,
) -> None:
    """Extend a lease from now; only its holder may (exit 3 otherwise)."""
    from ..operate.cli_printing import iso_time, print_json
    from ..protocol.validation import ttl_to_ms

    ttl_to_ms(ttl)  # the store's check, before connecting (a missing run is exit 5)
    store, lease = _lease_ref(ctx, run, item, token, lease_id, trace_id)
    renewed = store.renew(lease, ttl=ttl)
    expires = iso_time(renewed.expires_at_ms)
    if as_json:
        print_json({"run": run, "item": item, "token": token, "expires_at": expires})
    else:
        typer.echo(f"renewed {item} of run {run} (token {token}) until {expires}")


@app.command()
def commit(
    ctx: typer.Context,
    run: RunArg,
    item: ItemArg,
    token: TokenOpt,
    lease_id: LeaseIdOpt = "",
    trace_id: TraceIdOpt = "",
    result: Annotated[
        str | None, typer.Option("--result", help="JSON result to store with the item.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Mark an item done; refused (exit 3) unless the token is the current lease."""
    from ..operate.cli_printing import iso_time, print_json, warning_line

    value = json_option(result, "result") if result is not None else None
    store, lease = _lease_ref(ctx, run, item, token, lease_id, trace_id)
    outcome = store.commit(lease, value)
    if outcome.repeated and result is not None and outcome.result != value:
        warning_line(
            f"{item} of run {run} was already committed with token {outcome.token}: the stored "
            "outcome of that earlier commit was returned, not the new --result"
        )
    if as_json:
        print_json(
            {
                "run": run,
                "item": item,
                "token": outcome.token,
                "result": outcome.result,
                "done_at": iso_time(outcome.done_at_ms),
                "repeated": outcome.repeated,
            }
        )
    else:
        again = " (already committed with this token)" if outcome.repeated else ""
        typer.echo(f"committed {item} of run {run} (token {outcome.token}){again}")


@app.command()
def fail(
    ctx: typer.Context,
    run: RunArg,
    item: ItemArg,
    token: TokenOpt,
    error: Annotated[str, typer.Option("--error", "-e", help="What went wrong.")],
    lease_id: LeaseIdOpt = "",
    trace_id: TraceIdOpt = "",
    permanent: Annotated[
        bool, typer.Option("--permanent", help="Mark the item dead now, without retries.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Report a failed attempt: the item is retried with backoff, or dead."""
    from ..operate.cli_printing import iso_time, print_json
    from ..protocol.store.settle_encoding import error_text

    error_text(error)  # the store's check, before connecting (a missing run is exit 5)
    store, lease = _lease_ref(ctx, run, item, token, lease_id, trace_id)
    outcome = store.fail(lease, error, permanent=permanent)
    eligible = iso_time(outcome.eligible_at_ms)
    if as_json:
        print_json(
            {
                "run": run,
                "item": item,
                "state": outcome.state,
                "eligible_at": eligible,
                "attempts": outcome.attempts,
            }
        )
    elif outcome.state == "dead":
        typer.echo(f"{item} of run {run} is dead after {outcome.attempts} attempt(s)")
    else:
        typer.echo(f"{item} of run {run} will be retried from {eligible}")


@app.command()
def release(
    ctx: typer.Context,
    run: RunArg,
    item: ItemArg,
    token: TokenOpt,
    lease_id: LeaseIdOpt = "",
    trace_id: TraceIdOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Give an item back unprocessed; it is due again at once."""
    from ..operate.cli_printing import print_json

    store, lease = _lease_ref(ctx, run, item, token, lease_id, trace_id)
    store.release(lease)
    if as_json:
        print_json({"run": run, "item": item, "token": token, "released": True})
    else:
        typer.echo(f"released {item} of run {run} (token {token})")


@app.command()
def reap(
    ctx: typer.Context,
    run: RunArg,
    limit: Annotated[int, typer.Option("--limit", help="Most leases per shard.")] = DEFAULT_SWEEP,
    as_json: JsonOpt = False,
) -> None:
    """Move expired leases back to pending (or dead after their last attempt)."""
    from ..operate.cli_printing import print_json
    from ..protocol.store.call_checks import check_sweep

    check_sweep(run, limit)  # the store's checks, before connecting
    pending, dead = open_store(ctx).reap(run, limit=limit)
    if as_json:
        print_json({"run": run, "pending": pending, "dead": dead})
    else:
        typer.echo(f"run {run}: {pending} expired lease(s) back to pending, {dead} dead")


@app.command()
def requeue(
    ctx: typer.Context,
    run: RunArg,
    items: Annotated[
        list[str] | None, typer.Argument(help="Dead item ids; omit for every dead item.")
    ] = None,
    item_options: Annotated[
        list[str] | None,
        typer.Option("--item", "-i", help="A dead item id (repeat it); the same as ITEM."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="Most items per shard.")] = DEFAULT_SWEEP,
    as_json: JsonOpt = False,
) -> None:
    """Move dead items back to pending, with fresh attempts; an unknown item is exit 5."""
    from ..fleet.runs.run_control import requeue_items, resume_needed
    from ..operate.cli_printing import print_json
    from ..protocol.store.call_checks import check_sweep

    names = [*(items or []), *(item_options or [])]
    check_sweep(run, limit, names)  # the store's checks, before connecting
    store = open_store(ctx)
    count = requeue_items(store, run, names, limit)
    if as_json:
        print_json({"run": run, "requeued": count})
        return
    left = len(set(names)) - count if names else 0
    note = f" ({left} named item(s) not dead, left as they are)" if left > 0 else ""
    state = resume_needed(store, run) if count else None
    if state:
        note += f"; the run is {state}: nothing runs until resumed (redis-lease resume {run})"
    typer.echo(f"run {run}: {count} item(s) requeued{note}")
