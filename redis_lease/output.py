"""Printing for the CLI: JSON for scripts, rich tables for people, one-line errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text


def print_json(data: Any) -> None:
    """Prints ``data`` as one line of JSON on stdout."""
    typer.echo(json.dumps(data, ensure_ascii=False, default=str))


def print_table(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None
) -> None:
    """Prints rows under column headings as a rich table on stdout."""
    table = Table(title=Text(title) if title else None, title_justify="left")
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell_text(cell)) for cell in row))  # never markup
    # Built per call: sys.stdout may have been swapped since import (tests, pipes).
    Console(file=sys.stdout, soft_wrap=False).print(table)


def print_fields(fields: dict[str, Any], title: str | None = None) -> None:
    """Prints name/value pairs as a two-column rich table on stdout."""
    print_table(("field", "value"), fields.items(), title=title)


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


def error_line(message: str) -> None:
    """Prints ``error: <message>`` on stderr, folded onto one line."""
    typer.echo(f"error: {' '.join(message.split())}", err=True)


def warning_line(message: str) -> None:
    """Prints ``warning: <message>`` on stderr, folded onto one line."""
    typer.echo(f"warning: {' '.join(message.split())}", err=True)


def danger_line(message: str) -> None:
    """Prints ``danger: <message>`` on stderr, folded onto one line: a risk to the promise."""
    typer.echo(f"danger: {' '.join(message.split())}", err=True)
