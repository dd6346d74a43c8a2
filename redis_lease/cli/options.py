"""What every command module shares: the global settings and the store, the shared
arguments and options, their parsers, and the tick's progress line and exit code.

The app itself (:mod:`.app`) keeps the global options in ``ctx.obj`` (a
:class:`Settings`); a command gets its store from :func:`open_store`.
"""

from __future__ import annotations

import re
import sys
import time
import warnings
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..limits import DEFAULT_PREFIX, TTL_MAX_MS, TTL_MIN_MS

if TYPE_CHECKING:
    from ..fleet.tick.scheduler_tick import TickProgress, TickResult
    from ..protocol.store.lease_store import LeaseStore


DEFAULT_URL = "redis://127.0.0.1:6379/0"
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
#: Commands that stamp the protocol where none is stamped yet; the others only check it.
STAMPING_COMMANDS = frozenset({"worker"})


@dataclass
class Settings:
    """The global options, shared by every command through ``ctx.obj``."""

    url: str = DEFAULT_URL
    prefix: str = DEFAULT_PREFIX
    store: LeaseStore | None = None
    #: RQ's Redis when it is not the store's (required with a cluster URL).
    queue_url: str | None = None
    #: Whether ``url`` is :data:`DEFAULT_URL` because none was given (said on stderr).
    url_defaulted: bool = False


def open_store(ctx: typer.Context, *, needs_rq: bool = False) -> LeaseStore:
    """The store for this invocation (made once, closed when the command ends).

    ``needs_rq``: the command enqueues or reads RQ jobs, so a cluster URL without a
    queue URL is refused before anything is written (exit 2).

    When no URL was given, a ``using redis://...`` line on stderr names the default taken.
    Warnings become ``warning: ...`` lines on stderr; a server that may evict keys
    (``maxmemory-policy`` other than ``noeviction``) is a ``danger: ...`` line. The
    protocol stamp is checked (and stamped by the commands of :data:`STAMPING_COMMANDS`).

    Raises:
        RedisUnavailable: Redis cannot be reached, or refuses the login, a command
            (PermissionDenied) or the TLS handshake (TLSFailed).
        InvalidInput: the URL (malformed, unknown scheme) or prefix is not acceptable.
        ProtocolMismatch: the data is in a protocol this release does not speak (exit 9).
    """
    from ..operate.cli_printing import danger_line, warning_line
    from ..protocol.connection.clients import client_from_url
    from ..protocol.connection.server_checks import EvictionPolicyWarning, check_server
    from ..protocol.store.lease_store import LeaseStore
    from ..protocol.store.stamp import check_protocol

    settings = ctx.obj if isinstance(ctx.obj, Settings) else Settings()
    ctx.obj = settings
    if settings.store is None:
        if settings.url_defaulted:  # never on stdout: --json output stays JSON alone
            typer.echo(
                f"using {DEFAULT_URL} (no --url, REDIS_LEASE_URL or REDIS_URL given)", err=True
            )
        client = client_from_url(settings.url)
        ctx.find_root().call_on_close(client.close)
        rq_client = client_from_url(settings.queue_url) if settings.queue_url else None
        if rq_client is not None:
            ctx.find_root().call_on_close(rq_client.close)
        store = LeaseStore(client, prefix=settings.prefix, url=settings.url, rq_client=rq_client)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_server(client, settings.url)
            if rq_client is not None and settings.queue_url:
                check_server(rq_client, settings.queue_url)
        for warning in caught:
            if issubclass(warning.category, EvictionPolicyWarning):
                danger_line(str(warning.message))
            else:
                warning_line(str(warning.message))
        if needs_rq:
            store.rq  # noqa: B018  # raises InvalidInput when RQ has no Redis
        # before anything is written: data in a protocol this release does not speak is refused
        check_protocol(store, stamp=ctx.info_name in STAMPING_COMMANDS)
        settings.store = store
    elif needs_rq:
        settings.store.rq  # noqa: B018
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
TraceIdOpt = Annotated[
    str,
    typer.Option(
        "--trace-id", help="The claim's trace id, kept with the attempt in the attempt log."
    ),
]
TtlOpt = Annotated[
    float,
    typer.Option(
        "--ttl",
        metavar="SECONDS",
        help=f"Lease time to live: {TTL_MIN_MS / 1000:g} to {TTL_MAX_MS // 1000} seconds.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]


def parse_date(text: str, option: str) -> date:
    """An option's date, ``YYYY-MM-DD`` exactly.

    Raises:
        InvalidInput: anything else (``20261203`` and week dates included).
    """
    from ..errors import InvalidInput

    try:
        if not _DATE.fullmatch(text):
            raise ValueError(text)
        return date.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"invalid {option} {text!r}: use YYYY-MM-DD") from None


def parse_since(text: str, option: str) -> int:
    """An option's moment in ms: a date (:func:`parse_date`, midnight UTC) or an ISO 8601
    time (UTC when it has no offset).

    Raises:
        InvalidInput: neither.
    """
    from ..errors import InvalidInput
    from ..fleet.runs.lifecycle import to_ms

    if _DATE.fullmatch(text):
        day = parse_date(text, option)
        return to_ms(datetime(day.year, day.month, day.day, tzinfo=UTC))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"invalid {option} {text!r}: use YYYY-MM-DD or an ISO 8601 time"
        ) from None
    return to_ms(moment if moment.tzinfo else moment.replace(tzinfo=UTC))


def json_option(text: str, what: str) -> Any:
    """The JSON value of an option: the text itself, or ``@FILE`` (``@-``: stdin), as curl does.

    JSON text never starts with ``@``, so the two cannot be confused.

    Raises:
        InvalidInput: the file cannot be read, is not UTF-8 or not valid JSON.
    """
    from ..errors import InvalidInput
    from ..limits import JSON_MAX_BYTES
    from ..protocol.validation import parse_json

    if not text.startswith("@"):
        return parse_json(text, what)
    path = text[1:]
    if not path:
        raise InvalidInput(f"{what} '@' names no file: use @FILE, or @- for stdin")
    # A little past the limit is enough to say the value is too large.
    room = JSON_MAX_BYTES * 8 + 1
    try:
        if path == "-":
            data = sys.stdin.buffer.read(room) if hasattr(sys.stdin, "buffer") else b""
        else:
            with open(path, "rb") as source:
                data = source.read(room)
    except OSError as error:
        raise InvalidInput(f"{what} file {path!r} cannot be read: {error.strerror}") from None
    if len(data) >= room:
        raise InvalidInput(f"{what} file {path!r} is over the {JSON_MAX_BYTES}-byte limit")
    try:
        decoded = data.decode()
    except UnicodeDecodeError as error:
        raise InvalidInput(f"{what} file {path!r} is not UTF-8 (byte {error.start})") from None
    return parse_json(decoded, f"{what} from {path!r}")


# -- the tick's progress and exit code -----------------------------------------

#: Exit code of ``tick`` and ``start`` when the tick ran but some of its work failed.
TICK_FAILED_EXIT = 7
#: Exit code of ``worker --burst`` when shard jobs it ran failed, or jobs it took could not run.
JOBS_FAILED_EXIT = 8
#: Exit code of ``wait`` when the run ended partial, failed or canceled (not succeeded).
RUN_NOT_SUCCEEDED_EXIT = 11
#: Exit code of ``wait`` when its timeout passed before the run ended.
WAIT_TIMED_OUT_EXIT = 12
#: Seconds planning runs before its progress is shown.
PROGRESS_DELAY = 1.0


@contextmanager
def planning_progress(delay: float = PROGRESS_DELAY) -> Iterator[TickProgress]:
    """A progress line on stderr for planning that takes more than ``delay`` seconds.

    Only on a terminal; quiet otherwise (a pipe, a file, ``--json`` output read by
    a script). Yields the tick's ``progress`` callback.
    """
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=sys.stderr)
    started = time.monotonic()
    shown: dict[str, Any] = {}

    def progress(run_id: str, items: int) -> None:
        if not console.is_terminal or time.monotonic() - started < delay:
            return
        if "bar" not in shown:
            bar = Progress(
                SpinnerColumn(),
                TextColumn("planning {task.description}: {task.completed} items"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            bar.start()
            shown["bar"], shown["tasks"] = bar, {}
        tasks: dict[str, Any] = shown["tasks"]
        if run_id not in tasks:
            tasks[run_id] = shown["bar"].add_task(run_id, total=None)
        shown["bar"].update(tasks[run_id], completed=items)

    try:
        yield progress
    finally:
        if "bar" in shown:
            shown["bar"].stop()


def exit_if_failed(result: TickResult, made: Collection[str] = ()) -> None:
    """Exits 7, after one line saying so, when some of the tick's work failed, or a run
    the command ``made`` was finalized failed in it (before any work)."""
    from ..operate.cli_printing import error_line

    if result.failures:
        error_line(
            f"{len(result.failures)} of the tick's runs or jobs failed (the error lines above; "
            "each is in its run's log: redis-lease status RUN)"
        )
        raise typer.Exit(TICK_FAILED_EXIT)
    failed = [
        d.run_id
        for d in result
        if d.kind == "finalize" and d.run_id in made and d.reason.startswith("failed")
    ]
    if failed:
        error_line(
            f"{', '.join(failed)}: made and failed before any work (see its decisions: "
            "redis-lease status RUN)"
        )
        raise typer.Exit(TICK_FAILED_EXIT)
