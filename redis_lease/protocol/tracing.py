"""The trace id of an attempt: the current OpenTelemetry trace's, else a new one.

Every lease carries a trace id (``lease.trace_id``), sent with its commit, failure,
release or renewal and written to the shard's attempt log, so a log line, an alert or
a span leads to the exact attempt. When ``opentelemetry-api`` is installed and a valid
span is current where the lease is granted, the id is that span's trace id (32 lowercase
hex characters, as W3C trace context writes it); otherwise a random one of the same form
is made per attempt. OpenTelemetry is optional: nothing here needs it installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["current_trace_id", "new_trace_id", "trace_id"]


def new_trace_id() -> str:
    """A random trace id: 32 lowercase hex characters (16 random bytes, as W3C's)."""
    return os.urandom(16).hex()


def _no_span() -> str | None:
    return None


def _opentelemetry() -> Callable[[], str | None]:
    """The reader of the current span's trace id, or one that finds none without the package."""
    try:
        from opentelemetry import trace
    except ImportError:
        return _no_span

    def current() -> str | None:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return format(context.trace_id, "032x")

    return current


_reader: list[Callable[[], str | None]] = []


def current_trace_id() -> str | None:
    """The current OpenTelemetry span's trace id (None when there is none, or without the
    package); OpenTelemetry is imported on the first call, not with this module."""
    if not _reader:
        _reader.append(_opentelemetry())
    return _reader[0]()


def trace_id() -> str:
    """The current OpenTelemetry span's trace id when a valid span is current, else a new id."""
    return current_trace_id() or new_trace_id()
