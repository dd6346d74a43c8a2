"""Optional features and the extras that install them.

A core install (``pip install redis-lease``) brings what a worker, the tick and the
command line need. The dashboard, the metrics exporter and the embedded backend come
with extras; :func:`require` imports what a feature needs, or raises
:class:`~redis_lease.errors.MissingExtra` naming the extra to install.
"""

from __future__ import annotations

import json
from importlib import import_module
from importlib.metadata import PackageNotFoundError, distribution
from types import ModuleType
from urllib.parse import unquote, urlsplit

from .errors import MissingExtra

#: The packages each extra installs, as imported (pyproject.toml lists them by name).
EXTRAS: dict[str, tuple[str, ...]] = {
    "dashboard": ("flask", "flask_wtf", "waitress", "prometheus_client"),
    "metrics": ("prometheus_client",),
    "demo": ("fakeredis", "lupa"),
}


def require(extra: str, feature: str) -> None:
    """Imports every package of ``extra``, or raises MissingExtra for ``feature``.

    ``feature`` names what needs them, as the message shows it: ``the dashboard``.
    """
    for module in EXTRAS[extra]:
        optional_import(module, extra, feature)


def optional_import(module: str, extra: str, feature: str) -> ModuleType:
    """The module ``module``, which the extra ``extra`` installs; MissingExtra when it is
    not installed (exit 10), with one line naming the extra."""
    try:
        return import_module(module)
    except ImportError:
        raise MissingExtra(
            f"{feature} needs the extra {extra!r}: {install_command(extra)}",
            extra=extra,
        ) from None


def install_command(extra: str) -> str:
    """The pip command that adds ``extra`` to this install.

    It installs from where this copy came when pip recorded a local path (a clone or a
    built wheel, in ``direct_url.json``), else by name from the package index.
    """
    try:
        recorded = distribution("redis-lease").read_text("direct_url.json")
        url = str(json.loads(recorded)["url"]) if recorded else ""
    except (PackageNotFoundError, ValueError, KeyError, TypeError):
        url = ""
    source = unquote(urlsplit(url).path) if url.startswith("file://") else "redis-lease"
    return f"pip install '{source}[{extra}]'"
