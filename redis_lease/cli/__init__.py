"""The ``redis-lease`` command line: thin wrappers around the library.

The app and its error door are in :mod:`.app`; what the commands share (the store,
shared options, parsers) in :mod:`.shared`. One module per audience adds its commands to
the app with ``@app.command()``, and is registered here, in one place: :mod:`.leases`
(items and leases), :mod:`.operator` and :mod:`.status` (operator views: runs, items, dead
items, one item, a run's status, waiting for a run to end), :mod:`.fleet` (jobs and the
worker fleet), :mod:`.schedules` (schedules and backfill), :mod:`.capacity` (plan-capacity),
:mod:`.dashboard` and :mod:`.protocol` (the protocol stamp).
"""

from __future__ import annotations

from . import capacity, dashboard, fleet, leases, operator, protocol, schedules, status
from .app import LeaseGroup, app, report
from .shared import Settings, open_store

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


def main() -> None:
    """Runs the ``redis-lease`` command line (the console entry point)."""
    app()
