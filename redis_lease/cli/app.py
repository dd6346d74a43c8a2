"""The command line's app: global options, the store, error reporting, shared options.

The global options ``--url`` (with the TLS files of ``--tls-ca``, ``--tls-cert``
and ``--tls-key`` as its parameters, ``--tls-insecure`` allowing it to turn
verification off) and ``--prefix`` are kept in ``ctx.obj`` (a
:class:`~.options.Settings`); a command gets its store from
:func:`~.options.open_store`. Every
failure leaves through :meth:`LeaseGroup.main`: one ``error: ...`` line on stderr
and the documented exit code (docs/cli.md), never a traceback; a warning, one
``warning: ...`` line (:func:`show_warning`). The command
modules of this package add commands with ``@app.command()`` on :data:`app`.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable, Sequence
from importlib import import_module
from typing import Annotated, Any

import typer

from ..limits import DEFAULT_PREFIX, INSECURE_ENV
from .help_text import GROUP_OF, PLACE, ReadableGroup, ReadableTyper
from .options import DEFAULT_URL, Settings

#: Set to 1 to let unexpected exceptions show their traceback.
DEBUG_ENV = "REDIS_LEASE_DEBUG"
#: The modules of this package that add commands (``--help`` lists the commands in the
#: groups of :data:`.help_text.COMMAND_GROUPS`).
COMMAND_MODULES = (
    "capacity",
    "dashboard",
    "fleet",
    "leases",
    "operator",
    "protocol",
    "schedules",
    "status",
)
#: The module that adds each command: a command line imports only its command's module
#: (a name not here imports them all; tests/test_extras.py checks this list is whole).
COMMAND_HOMES = {
    "plan-capacity": "capacity",
    "dashboard": "dashboard",
    **dict.fromkeys(
        ("tick", "start", "worker", "resume", "finalize", "cancel", "demo", "metrics"), "fleet"
    ),
    **dict.fromkeys(
        ("add", "claim", "renew", "commit", "fail", "release", "reap", "requeue"), "leases"
    ),
    **dict.fromkeys(("runs", "items", "dead", "inspect", "resolve-effect"), "operator"),
    "protocol": "protocol",
    "backfill": "schedules",
    "schedule": "schedules",
    **dict.fromkeys(("status", "workers", "wait"), "status"),
}


def report(error: Exception) -> int:
    """Prints the one-line message for ``error`` on stderr and returns its exit code.

    Every redis-lease error carries its exit code (docs/cli.md); a Redis error
    that reached here untranslated (e.g. from RQ) is translated first.
    """
    from ..errors import RedisLeaseError
    from ..operate.cli_printing import error_line
    from ..protocol.connection.translate import REDIS_FAILURES, translating_errors

    if isinstance(error, REDIS_FAILURES) and not isinstance(error, RedisLeaseError):
        error = translating_errors("").error(error)
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
        global_hint = _global_option_hint(error)
        if global_hint:
            error_line(global_hint)
            return exit_code
        command_path = getattr(getattr(error, "ctx", None), "command_path", None)
        hint = f" (see '{command_path} --help')" if command_path else ""
        error_line(text + hint)
        return exit_code
    error_line(f"unexpected {type(error).__name__}: {error}")
    return 1


def _global_option_hint(error: Exception) -> str | None:
    """For a global option given after the command (``runs --url URL``): where it goes."""
    option = getattr(error, "option_name", None)
    ctx = getattr(error, "ctx", None)
    if type(error).__name__ != "NoSuchOption" or not option or ctx is None or ctx.parent is None:
        return None
    root = ctx.find_root()
    if not any(option in getattr(param, "opts", ()) for param in root.command.params):
        return None
    command = ctx.command_path[len(root.info_name or "") :].strip()
    return (
        f"{option} is a global option: put it before the command "
        f"({root.info_name} {option} ... {command} ...)"
    )


def _function(command: Any) -> Any:
    """The function a command made by typer runs (None for a group)."""
    return getattr(getattr(command, "callback", None), "__wrapped__", None)


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
    from ..operate.cli_printing import warning_line

    warning_line(str(message))


class LeaseGroup(ReadableGroup):
    """The root command: turns every failure into one stderr line and an exit code.

    Its commands are made when first named: a command line imports the module of its
    command (:data:`COMMAND_HOMES`) and not the others; listing them imports them all.
    """

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command ``cmd_name``, its module imported now when it was not yet, in its
        group of ``--help`` (:data:`.help_text.COMMAND_GROUPS`)."""
        if cmd_name not in self.commands:
            home = COMMAND_HOMES.get(cmd_name)
            self._add_commands(COMMAND_MODULES if home is None else (home,))
        command: Any = super().get_command(ctx, cmd_name)
        if command is not None:
            command.rich_help_panel = GROUP_OF.get(cmd_name)
        return command

    def list_commands(self, ctx: Any) -> list[str]:
        """Every command's name, in the groups and order of
        :data:`.help_text.COMMAND_GROUPS` (a command in none comes last)."""
        self._add_commands(COMMAND_MODULES)
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: PLACE.get(name, len(PLACE)))

    def _add_commands(self, modules: Iterable[str]) -> None:
        """Imports ``modules`` and makes the commands they added to :data:`app`."""
        for module in modules:
            import_module(f"{__package__}.{module}")
        made = {_function(command) for command in self.commands.values()}
        commands = [info for info in app.registered_commands if info.callback not in made]
        groups = [info for info in app.registered_groups if info.name not in self.commands]
        if not commands and not groups:
            return
        import typer.main

        new = typer.Typer(
            rich_markup_mode=app.rich_markup_mode,
            pretty_exceptions_short=app.pretty_exceptions_short,
        )
        new.registered_commands, new.registered_groups = commands, groups
        self.commands.update(typer.main.get_group(new).commands)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """The command named first in ``args``; a command's ``--help`` is shown here, before
        the global options are checked (their checks import Redis's client: help needs none)."""
        name, command, rest = super().resolve_command(ctx, args)
        asked = rest[: rest.index("--")] if "--" in rest else rest
        if command is not None and set(asked) & set(ctx.help_option_names):
            try:  # prints the help and exits, unless --help was an option's value
                command.make_context(name, list(rest), parent=ctx)
            except typer.Exit:
                raise
            except Exception:  # a usage error: reported as usual, after the global options
                pass
        return name, command, rest

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


app = ReadableTyper(
    name="redis-lease",
    cls=LeaseGroup,
    help="Fenced leases on the items of recoverable batch runs, in Redis.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool) -> None:
    from ..version import __version__

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
    from ..errors import InvalidInput
    from ..operate.cli_printing import warning_line
    from ..protocol.connection.tls import allow_insecure, check_tls_params, with_tls
    from ..protocol.connection.urls import is_cluster_url
    from ..protocol.validation import check_id

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
    source = ctx.get_parameter_source("url")
    ctx.obj = Settings(
        url=tls_url,
        prefix=prefix,
        queue_url=tls_queue_url,
        url_defaulted=source is None or source.name == "DEFAULT",
    )
