"""The ``redis-lease`` command line: thin wrappers around the library.

One module per audience: :mod:`.leases` (items and leases), :mod:`.operator` and
:mod:`.status` (operator views: runs, items, dead items, one item, a run's status),
:mod:`.fleet` (jobs and the worker fleet) and :mod:`.protocol` (the protocol stamp), each
adding its commands to the app of :mod:`.app`.
"""

from __future__ import annotations

from . import dashboard, fleet, leases, operator, protocol, status
from .app import LeaseGroup, Settings, app, open_store, report

__all__ = [
    "LeaseGroup",
    "Settings",
    "app",
    "dashboard",
    "fleet",
    "leases",
    "main",
    "open_store",
    "operator",
    "protocol",
    "report",
    "status",
]


def main() -> None:
    """Runs the ``redis-lease`` command line (the console entry point)."""
    app()
