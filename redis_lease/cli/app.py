"""The command line's app: global options, the store, error reporting, shared options.

The global options ``--url`` (with the TLS files of ``--tls-ca``, ``--tls-cert``
and ``--tls-key`` as its parameters, ``--tls-insecure`` allowing it to turn
verification off) and ``--prefix`` are kept in ``ctx.obj`` (a
:class:`Settings`); a command gets its store from :func:`open_store`. Every
failure leaves through :meth:`LeaseGroup.main`: one ``error: ...`` line on stderr
and the documented exit code (docs/cli.md), never a traceback; a warning, one
``warning: ...`` line (:func:`show_warning`). The command
modules of this package add commands with ``@app.command()`` on :data:`app`.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from .. import __version__
from ..connection import client_from_url
from ..errors import InvalidInput, RedisLeaseError
from ..failures import REDIS_FAILURES, translate
from ..limits import (
    DEFAULT_PREFIX,
    JSON_MAX_BYTES,
)
from ..output import (
    danger_line,
    error_line,
    warning_line,
)
from ..protocol_version import check_protocol
from ..runs import to_ms
from ..server_checks import EvictionPolicyWarning, check_server
from ..store import LeaseStore
from ..tls import INSECURE_ENV, allow_insecure, check_tls_params, with_tls
from ..urls import is_cluster_url
from ..validation import check_id, parse_json
from .capacity import plan_capacity

DEFAULT_URL = "redis://127.0.0.1:6379/0"
#: Set to 1 to let unexpected exceptions show their traceback.
DEBUG_ENV = "REDIS_LEASE_DEBUG"
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


def report(error: Exception) -> int:
    """Prints the one-line message for ``error`` on stderr and returns its exit code.

    Every redis-lease error carries its exit code (docs/cli.md); a Redis error
    that reached here untranslated (e.g. from RQ) is translated first.
    """
    if isinstance(error, REDIS_FAILURES) and not isinstance(error, RedisLeaseError):
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


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """Shows a warning that reached the command line (a library's, say) as one
    ``warning: ...`` line on stderr, without Python's source line."""
    warning_line(str(message))


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
            with warnings.catch_warnings():
                warnings.showwarning = show_warning
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
    add_completion=True,
    pretty_exceptions_enable=False,
)
app.command("plan-capacity")(plan_capacity)


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
            help="Redis URL: redis://, rediss://, unix://, redis+cluster://HOST:PORT[,...], "
            "redis+sentinel://HOST:PORT[,...]/SERVICE or fakeredis://NAME (in-process).",
        ),
    ] = DEFAULT_URL,
    queue_url: Annotated[
        str | None,
        typer.Option(
            "--queue-url",
            envvar="REDIS_LEASE_QUEUE_URL",
            help="Redis of RQ's queues when it is not --url's: required when --url is a "
            "cluster, where RQ does not run (a plain redis://, rediss:// or sentinel URL).",
        ),
    ] = None,
    prefix: Annotated[
        str, typer.Option("--prefix", envvar="REDIS_LEASE_PREFIX", help="Key prefix.")
    ] = DEFAULT_PREFIX,
    tls_ca: Annotated[
        str | None,
        typer.Option(
            "--tls-ca",
            envvar="REDIS_LEASE_TLS_CA",
            metavar="FILE",
            help="CA certificates (PEM) that sign the server's certificate (rediss:// only).",
        ),
    ] = None,
    tls_cert: Annotated[
        str | None,
        typer.Option(
            "--tls-cert",
            envvar="REDIS_LEASE_TLS_CERT",
            metavar="FILE",
            help="Client certificate (PEM), for servers that check clients (rediss:// only).",
        ),
    ] = None,
    tls_key: Annotated[
        str | None,
        typer.Option(
            "--tls-key",
            envvar="REDIS_LEASE_TLS_KEY",
            metavar="FILE",
            help="The client certificate's private key (PEM) (rediss:// only).",
        ),
    ] = None,
    tls_insecure: Annotated[
        bool,
        typer.Option(
            "--tls-insecure",
            envvar=INSECURE_ENV,
            help="Accept URL parameters that turn TLS verification off "
            "(ssl_cert_reqs=none|optional, ssl_check_hostname=false). Unsafe.",
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Fenced leases on the items of recoverable batch runs, in Redis."""
    check_id(prefix, "prefix")
    if tls_insecure:
        allow_insecure()  # also for the processes this one starts (workers)
    # As URL parameters, the TLS files reach every client made from the URL.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tls_url = with_tls(url, tls_ca, tls_cert, tls_key)
        if tls_url.lower().startswith("rediss"):
            check_tls_params(tls_url, "rediss")  # the URL's own parameters, files or not
        tls_queue_url = with_tls(queue_url, tls_ca, tls_cert, tls_key) if queue_url else None
    for warning in caught:
        warning_line(str(warning.message))
    if tls_queue_url is not None and is_cluster_url(tls_queue_url):
        raise InvalidInput(
            "--queue-url cannot be a cluster: RQ does not run on Redis Cluster; give a plain "
            "redis://HOST:PORT/DB"
        )
    ctx.obj = Settings(url=tls_url, prefix=prefix, queue_url=tls_queue_url)


def open_store(ctx: typer.Context, *, needs_rq: bool = False) -> LeaseStore:
    """The store for this invocation (made once, closed when the command ends).

    ``needs_rq``: the command enqueues or reads RQ jobs, so a cluster URL without a
    queue URL is refused before anything is written (exit 2).

    Warnings become ``warning: ...`` lines on stderr; a server that may evict keys
    (``maxmemory-policy`` other than ``noeviction``) is a ``danger: ...`` line. The
    protocol stamp is checked (and stamped by the commands of :data:`STAMPING_COMMANDS`).

    Raises:
        RedisUnavailable: Redis cannot be reached, or refuses the login, a command
            (PermissionDenied) or the TLS handshake (TLSFailed).
        InvalidInput: the URL (malformed, unknown scheme) or prefix is not acceptable.
        ProtocolMismatch: the data is in a protocol this release does not speak (exit 9).
    """
    settings = ctx.obj if isinstance(ctx.obj, Settings) else Settings()
    ctx.obj = settings
    if settings.store is None:
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
TtlOpt = Annotated[float, typer.Option("--ttl", help="Lease time to live in seconds.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]


def parse_date(text: str, option: str) -> date:
    """An option's date, ``YYYY-MM-DD`` exactly.

    Raises:
        InvalidInput: anything else (``20261203`` and week dates included).
    """
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
