"""Lease commands: add, claim, renew, commit, fail, release, reap, requeue, inspect."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..errors import InvalidInput
from ..lease import Item, ItemRecord, Lease
from ..limits import (
    ATTEMPTS_MAX,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_SWEEP,
    DEFAULT_TTL,
    SHARD_COUNT_MAX,
    SWEEP_MAX,
)
from ..output import compact_json, print_fields, print_json
from ..store import LeaseStore
from ..validation import check_id, check_positive, parse_json, ttl_to_ms
from .app import (
    ItemArg,
    JsonOpt,
    LeaseIdOpt,
    RunArg,
    TokenOpt,
    TtlOpt,
    app,
    iso_ms,
    open_store,
)


def _lease_ref(
    ctx: typer.Context, run: str, item: str, token: int, lease_id: str
) -> tuple[LeaseStore, Lease]:
    """Checks the ids, then the store and a Lease by token for a holder command."""
    check_id(run, "run id")
    check_id(item, "item id")
    if lease_id:
        check_id(lease_id, "lease id")
    store = open_store(ctx)
    return store, store.lease_ref(run, item, token, lease_id)


def record_dict(record: ItemRecord) -> dict[str, Any]:
    """An item record as JSON-ready data (``expires_at`` in ISO 8601 UTC)."""
    return {
        "run": record.run_id,
        "item": record.item_id,
        "shard": record.shard,
        "state": record.state,
        "token": record.token,
        "attempts": record.attempts,
        "owner": record.owner,
        "lease_id": record.lease_id,
        "expires_at": iso_ms(record.expires_at_ms),
        "payload": record.payload,
        "result": record.result,
        "error": record.error,
    }


# -- commands -----------------------------------------------------------------


@app.command()
def add(
    ctx: typer.Context,
    run: RunArg,
    items: Annotated[list[str], typer.Argument(help="Item ids to add.")],
    payload: Annotated[
        str | None, typer.Option("--payload", help="JSON payload for every item added.")
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
    check_id(run, "run id")
    for item in items:
        check_id(item, "item id")
    value = parse_json(payload) if payload is not None else None
    if shards is not None:
        check_positive(shards, "shards", SHARD_COUNT_MAX)
    check_positive(max_attempts, "max attempts", ATTEMPTS_MAX)
    store = open_store(ctx)
    added, existing = store.add(
        run, [Item(item, value) for item in items], shards=shards, max_attempts=max_attempts
    )
    data = {
        "run": run,
        "added": len(added),
        "existing": len(existing),
        "shards": store.shard_count(run),
    }
    if as_json:
        print_json(data)
    else:
        typer.echo(f"run {run}: {len(added)} added, {len(existing)} already there")


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
    check_id(run, "run id")
    if item is not None:
        check_id(item, "item id")
    check_id(worker, "worker")
    ttl_to_ms(ttl)
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
    ttl: TtlOpt = DEFAULT_TTL,
    as_json: JsonOpt = False,
) -> None:
    """Extend a lease from now; only its holder may (exit 3 otherwise)."""
    ttl_to_ms(ttl)
    store, lease = _lease_ref(ctx, run, item, token, lease_id)
    renewed = store.renew(lease, ttl=ttl)
    expires = iso_ms(renewed.expires_at_ms)
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
    result: Annotated[
        str | None, typer.Option("--result", help="JSON result to store with the item.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Mark an item done; refused (exit 3) unless the token is the current lease."""
    value = parse_json(result, "result") if result is not None else None
    store, lease = _lease_ref(ctx, run, item, token, lease_id)
    outcome = store.commit(lease, value)
    if as_json:
        print_json(
            {
                "run": run,
                "item": item,
                "token": outcome.token,
                "result": outcome.result,
                "done_at": iso_ms(outcome.done_at_ms),
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
    permanent: Annotated[
        bool, typer.Option("--permanent", help="Mark the item dead now, without retries.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Report a failed attempt: the item is retried with backoff, or dead."""
    if not error.strip():
        raise InvalidInput("--error must say what failed", run_id=run, item_id=item)
    store, lease = _lease_ref(ctx, run, item, token, lease_id)
    outcome = store.fail(lease, error, permanent=permanent)
    eligible = iso_ms(outcome.eligible_at_ms)
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
    as_json: JsonOpt = False,
) -> None:
    """Give an item back unprocessed; it is due again at once."""
    store, lease = _lease_ref(ctx, run, item, token, lease_id)
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
    check_id(run, "run id")
    check_positive(limit, "limit", SWEEP_MAX)
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
    limit: Annotated[int, typer.Option("--limit", help="Most items per shard.")] = DEFAULT_SWEEP,
    as_json: JsonOpt = False,
) -> None:
    """Move dead items back to pending, with fresh attempts."""
    check_id(run, "run id")
    names = items or []
    for item in names:
        check_id(item, "item id")
    check_positive(limit, "limit", SWEEP_MAX)
    count = open_store(ctx).requeue(run, names, limit=limit)
    if as_json:
        print_json({"run": run, "requeued": count})
    else:
        typer.echo(f"run {run}: {count} item(s) requeued")


@app.command()
def inspect(ctx: typer.Context, run: RunArg, item: ItemArg, as_json: JsonOpt = False) -> None:
    """Show the stored record of one item."""
    check_id(run, "run id")
    check_id(item, "item id")
    data = record_dict(open_store(ctx).item(run, item))
    if as_json:
        print_json(data)
    else:
        print_fields(data, title=f"item {item} of run {run}")
