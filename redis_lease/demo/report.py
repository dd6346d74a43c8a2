"""The demo's progress bar and report table."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


@contextmanager
def progress_bar() -> Iterator[tuple[Callable[[str], None], Callable[[int, int], None]]]:
    """A progress bar; yields (on_backend, on_progress) callbacks for run_demo."""
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]reconciling"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("items", total=None)

        def on_backend(text: str) -> None:
            progress.console.print(f"backend: {text}")

        def on_progress(finished: int, total: int) -> None:
            progress.update(task, completed=finished, total=total or None)

        yield on_backend, on_progress


def print_report(report: dict[str, Any]) -> None:
    """The demo's report as a table on stdout."""
    table = Table(title=f"run {report['run_id']}", title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("items", report["items"]),
        ("done", report["done"]),
        ("dead", report["dead"]),
        ("effects applied", report["effects_applied"]),
        ("provider requests", report["provider_requests"]),
        ("duplicate effects", report["duplicate_effects"]),
        ("effects reconciled", report["effects_reconciled"]),
        ("stale commits refused", report["stale_commits_refused"]),
        ("lease takeovers", report["lease_takeovers"]),
        ("retries", report["retries"]),
        ("run state", report["state"]),
        ("deadline", report["deadline"]),
        ("duration (s)", report["duration_seconds"]),
    ]
    if report["done_after_end"]:
        rows.insert(2, ("done after the run ended", report["done_after_end"]))
    for name, value in rows:
        table.add_row(name, str(value))
    console = Console()
    console.print(table)
    console.print(f"reason: {report['reason']}")
    for fault in report["faults"]:
        console.print(f"fault: {fault}")
    console.print(f"backend: {report['backend']}")
