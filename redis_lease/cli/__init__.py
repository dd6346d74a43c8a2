"""The ``redis-lease`` command line: thin wrappers around the library.

The app and its error handling are in :mod:`.app`; what the commands share (the store,
shared options, parsers) in :mod:`.options`. One module per audience adds its commands to
the app with ``@app.command()``, and is named in :data:`.app.COMMAND_MODULES` (each command
in :data:`.app.COMMAND_HOMES`), imported when one of its commands is run: :mod:`.leases`
(items and leases), :mod:`.operator` and :mod:`.status` (operator views: runs, items, dead
items, one item, a run's status, waiting for a run to end), :mod:`.fleet` (jobs and the
worker fleet), :mod:`.schedules` (schedules and backfill), :mod:`.capacity` (plan-capacity),
:mod:`.dashboard` and :mod:`.protocol` (the protocol stamp).
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from .app import COMMAND_MODULES, LeaseGroup, app, report
from .options import Settings, open_store

__all__ = [
    "LeaseGroup",
    "Settings",
    "app",
    "capacity",
    "dashboard",
    "fleet",
    "leases",
    "main",
    "open_store",
    "operator",
    "protocol",
    "report",
    "schedules",
    "status",
]


def __getattr__(name: str) -> ModuleType:
    """A command module (``redis_lease.cli.status``, ...), imported on first use: a
    command line imports only its own command's module (:class:`LeaseGroup`)."""
    if name in COMMAND_MODULES:
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Runs the ``redis-lease`` command line (the console entry point)."""
    app()
