"""The pure parts of benchmarks/peers.py: medians, ratios, a peer's figures and the report.

Nothing here starts a worker or times anything; ``peers.py`` measures the rounds and
hands them here to be summed up, compared and printed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any


def median(values: list[float]) -> float | None:
    """The median of ``values``, or None when there are none."""
    return float(statistics.median(values)) if values else None


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """``ours / theirs`` rounded to 2 places, or None when either is missing or ``theirs`` is 0."""
    if ours is None or theirs is None or theirs == 0:
        return None
    return round(ours / theirs, 2)


@dataclass
class Round:
    """One measured consume phase of one peer: its items and what they cost the server."""

    items: int
    seconds: float
    cpu_seconds: float
    commands: float
    startup_seconds: float
    failed: int = 0
    polls: int = 0
    poll_commands: float = 0.0
    load_1m: float = 0.0
    top_commands: dict[str, float] = field(default_factory=dict)

    @property
    def items_per_s(self) -> float:
        """Items finished per second in the phase."""
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def server_us_per_item(self) -> float:
        """Server CPU microseconds per item."""
        return self.cpu_seconds * 1e6 / self.items if self.items else 0.0

    @property
    def commands_per_item(self) -> float:
        """Redis commands (inside scripts too) per item."""
        return self.commands / self.items if self.items else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The round as JSON-ready data."""
        return {
            "items": self.items,
            "seconds": round(self.seconds, 3),
            "items_per_s": round(self.items_per_s, 1),
            "server_us_per_item": round(self.server_us_per_item, 1),
            "commands_per_item": round(self.commands_per_item, 2),
            "startup_seconds": round(self.startup_seconds, 2),
            "failed": self.failed,
            "harness_polls": self.polls,
            "commands_per_poll": round(self.poll_commands, 2),
            "load_1m": round(self.load_1m, 2),
        }


def summarize(rounds: list[Round], planned: int) -> dict[str, Any]:
    """A peer's figure for one handler: the medians of its rounds, and each round."""

    def med(values: list[float], places: int) -> float | None:
        found = median(values)
        return None if found is None else round(found, places)

    by_rate = sorted(rounds, key=lambda r: r.items_per_s)
    return {
        "items_per_s": med([r.items_per_s for r in rounds], 1),
        "server_us_per_item": med([r.server_us_per_item for r in rounds], 1),
        "commands_per_item": med([r.commands_per_item for r in rounds], 2),
        "items": planned,
        "rounds": [r.to_dict() for r in rounds],
        "top_commands_per_item": by_rate[len(by_rate) // 2].top_commands if rounds else {},
    }


FigureMap = dict[str, dict[str, dict[str, Any] | None] | None]


def peer_ratios(peers: FigureMap) -> dict[str, dict[str, dict[str, float | None]] | None]:
    """redis-lease / peer for every figure, handler and peer (None where either is missing).

    Above 1 means more items/s for redis-lease, but more server CPU or commands per item.
    """
    ours = peers.get("redis_lease") or {}
    out: dict[str, dict[str, dict[str, float | None]] | None] = {}
    for name, figures in peers.items():
        if name == "redis_lease":
            continue
        if figures is None:
            out[name] = None
            continue
        row: dict[str, dict[str, float | None]] = {}
        out[name] = row
        for handler, theirs in figures.items():
            mine = ours.get(handler)
            row[handler] = {
                key: ratio(
                    None if mine is None else mine.get(key),
                    None if theirs is None else theirs.get(key),
                )
                for key in ("items_per_s", "server_us_per_item", "commands_per_item")
            }
    return out


def concurrency_run(
    figures: dict[str, dict[str, Any] | None] | None,
    handler: str,
    concurrency: int,
    ideal: float,
    rq_simple: dict[str, dict[str, Any] | None] | None,
) -> dict[str, Any]:
    """An extra redis-lease run at another concurrency, with one handler: its figure, its
    share of the ideal items/s, and its items/s against RQ SimpleWorker's (same handler)."""
    figure = (figures or {}).get(handler)
    theirs = (rq_simple or {}).get(handler)
    rate = None if figure is None else figure.get("items_per_s")
    return {
        "handler": handler,
        "concurrency": concurrency,
        "figure": figure,
        "ideal_items_per_s": ideal,
        "of_ideal": None if rate is None or not ideal else round(rate / ideal, 3),
        "items_per_s_vs_rq_simple": ratio(rate, None if theirs is None else theirs["items_per_s"]),
    }


def build_report(
    peers: FigureMap,
    unavailable: dict[str, str],
    cycles: dict[str, Any] | None,
    context: dict[str, Any],
    c32: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The one JSON object: context, figures per peer, ratios, the lock baseline, and the
    extra concurrency-32 run (``redis_lease_c32``, None when it was not run)."""
    return {
        **context,
        "peers": peers,
        "unavailable": unavailable,
        "ratios": peer_ratios(peers),
        "redis_lease_c32": c32,
        "redis_lease_cycle_vs_lock": cycles,
    }


def table(report: dict[str, Any]) -> str:
    """The figures as a Markdown table (the ratio columns are redis-lease / peer)."""
    rows = [
        "| peer | handler | items | items/s | server us/item | cmds/item | items/s ratio "
        "| us/item ratio | cmds/item ratio |",
        "|" + "---|" * 9,
    ]
    for name, figures in report["peers"].items():
        if figures is None:
            rows.append(f"| {name} | - | | unavailable: {report['unavailable'].get(name)} |||||")
            continue
        for handler, fig in figures.items():
            if fig is None:
                rows.append(f"| {name} | {handler} | | failed ||||||")
                continue
            r = (report["ratios"].get(name) or {}).get(handler) or {}
            cells = [r.get(k) for k in ("items_per_s", "server_us_per_item", "commands_per_item")]
            shown = " | ".join("" if c is None else f"{c:.2f}x" for c in cells)
            rows.append(
                f"| {name} | {handler} | {fig['items']} | {fig['items_per_s']:,.0f} "
                f"| {fig['server_us_per_item']} | {fig['commands_per_item']} | {shown} |"
            )
    extra = report.get("redis_lease_c32")
    if extra and extra["figure"]:
        fig, vs_rq = extra["figure"], extra["items_per_s_vs_rq_simple"]
        shown = "" if vs_rq is None else f"{vs_rq:.2f}x rq_simple"
        rows.append(
            f"| redis_lease at concurrency {extra['concurrency']} | {extra['handler']} "
            f"| {fig['items']} | {fig['items_per_s']:,.0f} | {fig['server_us_per_item']} "
            f"| {fig['commands_per_item']} | {shown} | | |"
        )
    return "\n".join(rows)
