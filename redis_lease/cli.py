"""The ``redis-lease`` command line: thin wrappers around :class:`LeaseStore`.

The global options ``--url`` and ``--prefix`` are kept in ``ctx.obj`` (a
:class:`Settings`); a command gets its store from :func:`open_store`. Every
failure leaves through :meth:`LeaseGroup.main`: one ``error: ...`` line on stderr
and the documented exit code (docs/cli.md), never a traceback. Other modules add
commands with ``@app.command()`` on the :data:`app` defined here.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import redis
import typer
from typer.core import TyperGroup

from . import __version__
from .connection import (
    EvictionPolicyWarning,
    as_text,
    client_from_url,
    eviction_danger,
    translate,
    warn_unless_noeviction,
)
from .errors import InvalidInput, NotFound, RedisLeaseError
from .lease import Item, ItemRecord, Lease, RunStatus, from_ms
from .limits import (
    ATTEMPTS_MAX,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PREFIX,
    DEFAULT_SWEEP,
    DEFAULT_TTL,
    SHARD_COUNT_MAX,
    SWEEP_MAX,
)
from .output import (
    compact_json,
    danger_line,
    error_line,
    print_fields,
    print_json,
    print_table,
    warning_line,
)
from .store import LeaseStore
from .validation import check_id, check_positive, parse_json, ttl_to_ms

DEFAULT_URL = "redis://127.0.0.1:6379/0"
#: Set to 1 to let unexpected exceptions show their traceback.
DEBUG_ENV = "REDIS_LEASE_DEBUG"


@dataclass
class Settings:
    """The global options, shared by every command through ``ctx.obj``."""

    url: str = DEFAULT_URL
    prefix: str = DEFAULT_PREFIX
    store: LeaseStore | None = None


def report(error: Exception) -> int:
    """Prints the one-line message for ``error`` on stderr and returns its exit code.

    Every redis-lease error carries its exit code (docs/cli.md); a Redis error
    that reached here untranslated (e.g. from RQ) is translated first.
    """
    if isinstance(error, redis.RedisError) and not isinstance(error, RedisLeaseError):
        error = translate("", error)
    if isinstance(error, RedisLeaseError):
        error_line(str(error))
        return error.exit_code
    if isinstance(error, typer.Abort):
        error_line("aborted")
        return 1
    # Typer's usage and parameter errors (click's, vendored by newer typer releases).
    format_message = getattr(error, "format_message", None)
    exit_code = getattr(error, "exit_code", None)
    if callable(format_message) and isinstance(exit_code, int):
        text = str(format_message())
        if type(error).__name__ == "NoArgsIsHelpError":
            if text.strip():  # rich help is printed while it is built, plain help is not
                typer.echo(text, err=True)
            return exit_code
        command_path = getattr(getattr(error, "ctx", None), "command_path", None)
        hint = f" (see '{command_path} --help')" if command_path else ""
        error_line(text + hint)
        return exit_code
    error_line(f"unexpected {type(error).__name__}: {error}")
    return 1


class LeaseGroup(TyperGroup):
    """The root command: turns every failure into one stderr line and an exit code."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        """Runs the command line; with ``standalone_mode=False`` errors propagate."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            # Non-standalone: click hands errors to us instead of printing them itself.
            result = super().main(
                args, prog_name, complete_var, False, windows_expand_args, **extra
            )
        except Exception as error:
            if os.environ.get(DEBUG_ENV) == "1":
                raise
            sys.exit(report(error))
        # An Exit (``--help``, Ctrl-C) comes back as its code; a command returns None.
        sys.exit(result if isinstance(result, int) else 0)


app = typer.Typer(
    name="redis-lease",
    cls=LeaseGroup,
    help="Fenced leases on the items of recoverable batch runs, in Redis.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"redis-lease {__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    ctx: typer.Context,
    url: Annotated[
        str,
        typer.Option(
            "--url",
            envvar=["REDIS_LEASE_URL", "REDIS_URL"],
            help="Redis URL: redis://, rediss://, unix:// or fakeredis://NAME (in-process).",
        ),
    ] = DEFAULT_URL,
    prefix: Annotated[
        str, typer.Option("--prefix", envvar="REDIS_LEASE_PREFIX", help="Key prefix.")
    ] = DEFAULT_PREFIX,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Fenced leases on the items of recoverable batch runs, in Redis."""
    check_id(prefix, "prefix")
    ctx.obj = Settings(url=url, prefix=prefix)


def open_store(ctx: typer.Context) -> LeaseStore:
    """The store for this invocation (made once, closed when the command ends).

    Warnings become ``warning: ...`` lines on stderr; a server that may evict keys
    (``maxmemory-policy`` other than ``noeviction``) is a ``danger: ...`` line.

    Raises:
        RedisUnavailable: Redis cannot be reached, or refuses the login, a command
            (PermissionDenied) or the TLS handshake (TLSFailed).
        InvalidInput: the URL (malformed, unknown scheme) or prefix is not acceptable.
    """
    settings = ctx.obj if isinstance(ctx.obj, Settings) else Settings()
    ctx.obj = settings
    if settings.store is None:
        client = client_from_url(settings.url)
        ctx.find_root().call_on_close(client.close)
        store = LeaseStore(client, prefix=settings.prefix, url=settings.url)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn_unless_noeviction(client, settings.url)
        for warning in caught:
            if issubclass(warning.category, EvictionPolicyWarning):
                danger_line(str(warning.message))
            else:
                warning_line(str(warning.message))
        settings.store = store
    return settings.store


# -- shared options -----------------------------------------------------------

RunArg = Annotated[str, typer.Argument(help="Run id, e.g. payment-reconciliation:2026-12-02.")]
ItemArg = Annotated[str, typer.Argument(help="Item id.")]
TokenOpt = Annotated[
    int, typer.Option("--token", "-t", min=1, help="Fencing token from the claim.")
]
LeaseIdOpt = Annotated[
    str, typer.Option("--lease-id", "-l", help="Lease id from the claim (checked when given).")
]
TtlOpt = Annotated[float, typer.Option("--ttl", help="Lease time to live in seconds.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]


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


def _iso(ms: int | None) -> str | None:
    return from_ms(ms).isoformat(timespec="milliseconds") if ms else None


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
        "expires_at": _iso(record.expires_at_ms),
        "payload": record.payload,
        "result": record.result,
        "error": record.error,
    }


def run_details(
    store: LeaseStore, status: RunStatus
) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The run's recorded decisions and its job's recorded settings (empty for ad-hoc runs)."""
    from .runs import Runs

    decisions = Runs(store).events(status.run_id)
    job = status.info.get("job")
    settings: dict[str, str] = {}
    if job:
        with store.errors(status.run_id):
            raw = store.client.hgetall(store.keys.job(job))
        settings = {as_text(k): as_text(v) for k, v in raw.items()}
    return decisions, settings


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
    expires = _iso(renewed.expires_at_ms)
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
                "done_at": _iso(outcome.done_at_ms),
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
    eligible = _iso(outcome.eligible_at_ms)
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
    from .runs import Runs

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
                "deadline": _iso(int(info["deadline_at"])) if info.get("deadline_at") else None,
                "rate (items/s)": info.get("rate_per_s"),
                "projected finish": _iso(int(info["projected_finish_at"]))
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
                [(_iso(int(d.get("at", "0"))), d.get("kind"), d.get("reason")) for d in decisions],
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


def main() -> None:
    """Runs the ``redis-lease`` command line (the console entry point)."""
    app()


# The job and fleet commands (tick, start, worker, resume, schedule, demo) register on app.
from . import cli_fleet as _cli_fleet  # noqa: E402, F401
