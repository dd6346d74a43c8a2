"""Printing for the CLI: JSON for scripts, tables for people, plain text for pipes, one-line errors.

On a terminal a table is a rich table; when it cannot fit the terminal's width
without cutting an id, each row is printed as a block of ``column  value`` lines
instead. Anywhere else (a pipe, a file) it is plain text: one tab-separated line
per row, never wrapped, so ``redis-lease runs | grep RUN`` finds the whole row.
``TTY_COMPATIBLE=1`` (or ``0``) overrides the terminal check, as for rich.

Every time the CLI prints is :func:`iso_time`'s form, ISO 8601 in UTC with
milliseconds (``2026-12-02T02:10:00.123+00:00``), the form the library's errors use.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import typer

#: Wider than any terminal: used to measure the width a table needs.
_UNBOUNDED = 100_000
#: An ISO 8601 time with an offset (``Z`` or ``+HH:MM``) inside a text.
_ISO_TIME = re.compile(
    r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?(?:Z|[+-]\d{2}:\d{2})(?![\w:])"
)


def is_terminal() -> bool:
    """Whether stdout is a terminal (``TTY_COMPATIBLE=1``/``0`` says so explicitly)."""
    forced = os.environ.get("TTY_COMPATIBLE", "")
    if forced in ("0", "1"):
        return forced == "1"
    isatty = getattr(sys.stdout, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def _may_be_terminal(stream: Any) -> bool:
    """False when rich would surely not take ``stream`` for a terminal (``TTY_COMPATIBLE=0``,
    or neither ``TTY_COMPATIBLE=1``, ``FORCE_COLOR`` nor a tty), so that rich need not be
    imported to ask it; True when rich may (then it is asked)."""
    forced = os.environ.get("TTY_COMPATIBLE", "")
    if forced in ("0", "1"):
        return forced == "1"
    if os.environ.get("FORCE_COLOR") is not None:
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def print_json(data: Any) -> None:
    """Prints ``data`` as one line of JSON on stdout."""
    typer.echo(json.dumps(data, ensure_ascii=False, default=str))


def print_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    title: str | None = None,
    *,
    keep: Collection[str] = ("run", "item"),
) -> None:
    """Prints rows under column headings: a table on a terminal, plain lines otherwise.

    Args:
        columns: the headings.
        rows: the cells of each row (None is '-', lists and dicts compact JSON).
        title: a line above the table.
        keep: the columns never wrapped or cut (ids): a table that cannot hold
            them whole at the terminal's width is printed as one block per row.
    """
    cells = [[cell_text(cell) for cell in row] for row in rows]
    if not is_terminal():
        if title:
            typer.echo(title)
        for line in (list(columns), *cells):
            typer.echo("\t".join(_one_line(cell) for cell in line))
        return
    from rich.console import Console  # only for a terminal: rich takes a while to import
    from rich.table import Table
    from rich.text import Text

    # Built per call: sys.stdout may have been swapped since import (tests, pipes).
    console = Console(file=sys.stdout, soft_wrap=False)
    if title:  # never wrapped: it often names a run
        console.print(Text(title), soft_wrap=True)
    table = Table()
    for index, name in enumerate(columns):
        if name in keep:
            widest = max((len(row[index]) for row in cells if index < len(row)), default=0)
            table.add_column(name, no_wrap=True, min_width=max(widest, len(name)))
        else:
            table.add_column(name, overflow="fold")
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))  # never markup
    needed = Console(file=sys.stdout, width=_UNBOUNDED).measure(table).minimum
    if needed <= console.width:
        console.print(table)
        return
    name_width = max((len(name) for name in columns), default=0)
    for row in cells:
        console.print()
        for name, cell in zip(columns, row, strict=False):
            console.print(Text(f"{name:<{name_width}}  {cell}"), soft_wrap=name in keep)


def _one_line(cell: str) -> str:
    """A cell on one plain line: tabs and line breaks become spaces."""
    return " ".join(cell.split()) if any(c in cell for c in "\t\r\n") else cell


@contextmanager
def progress_bar(label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr while the block runs, when stderr is a terminal.

    Yields the function to call with each step's count; elsewhere it does nothing.
    """
    if not _may_be_terminal(sys.stderr):  # rich is imported only when it may be needed
        yield lambda steps: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = Console(file=sys.stderr)
    if not console.is_terminal:
        yield lambda steps: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeRemainingColumn(), console=console, transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda steps: progress.advance(task, steps)


def print_fields(fields: dict[str, Any], title: str | None = None) -> None:
    """Prints name/value pairs as a two-column table on stdout."""
    print_table(("field", "value"), fields.items(), title=title, keep=())


def cell_text(value: Any) -> str:
    """A table cell: '-' for None, compact JSON for lists and dicts, else str()."""
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return compact_json(value)
    return str(value)


def compact_json(value: Any) -> str:
    """``value`` as JSON text without spaces."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def iso_time(ms: int | None) -> str | None:
    """A server time in ms as the CLI prints every time (ISO 8601 UTC, ms); None for none."""
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def same_times(text: str) -> str:
    """``text`` with every ISO 8601 time that has an offset in :func:`iso_time`'s form.

    Recorded reasons name times in a job's timezone or to the second
    (``scheduled at 2026-12-02T02:00:00+01:00``); shown beside the decision
    times, they read ``2026-12-02T01:00:00.000+00:00``.
    """

    def utc(match: re.Match[str]) -> str:
        try:
            moment = datetime.fromisoformat(match.group(0))
        except ValueError:
            return match.group(0)
        return moment.astimezone(UTC).isoformat(timespec="milliseconds")

    return _ISO_TIME.sub(utc, text)


def error_line(message: str) -> None:
    """Prints ``error: <message>`` on stderr, folded onto one line."""
    typer.echo(f"error: {' '.join(message.split())}", err=True)


def warning_line(message: str) -> None:
    """Prints ``warning: <message>`` on stderr, folded onto one line."""
    typer.echo(f"warning: {' '.join(message.split())}", err=True)


def danger_line(message: str) -> None:
    """Prints ``danger: <message>`` on stderr, folded onto one line: a risk to the promise."""
    typer.echo(f"danger: {' '.join(message.split())}", err=True)
