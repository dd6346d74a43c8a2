"""How fast the command line answers: ``redis-lease`` commands beside ``rq --help``.

Each round runs every measured command once, in the same order (A B C A B C ...), so
that a change of the machine's load reaches every command alike; the figures are the
medians over ``--rounds`` rounds of the wall time from start to exit, and each command's
ratio to ``rq --help`` measured in the same run (below 1.0: faster than ``rq --help``).

Measured: ``redis-lease --help``, ``redis-lease status --help``, ``redis-lease runs``,
``redis-lease status RUN``, ``redis-lease workers`` and ``redis-lease inspect RUN ITEM``
(against a private redis-server the benchmark starts, holding one run), ``rq --help``;
with ``--every-command`` also each command's ``--help``.

Usage::

    python benchmarks/cli_start.py [--rounds 15] [--every-command] [--json]

The executables are those beside the running Python (``.venv/bin``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_fleet import redis_for
from redis_lease import Item, LeaseStore

BIN = Path(sys.executable).parent
BASELINE = "rq --help"


def commands(url: str, every_command: bool) -> dict[str, list[str]]:
    """The measured command lines by label; ``rq --help`` is the baseline."""
    lease = str(BIN / "redis-lease")
    measured = {
        "redis-lease --help": [lease, "--help"],
        "redis-lease status --help": [lease, "status", "--help"],
        "redis-lease runs": [lease, "--url", url, "--prefix", "clistart", "runs"],
        "redis-lease status": [lease, "--url", url, "--prefix", "clistart", "status", "r"],
        "redis-lease workers": [lease, "--url", url, "--prefix", "clistart", "workers"],
        "redis-lease inspect": [lease, "--url", url, "--prefix", "clistart", "inspect", "r", "i7"],
        BASELINE: [str(BIN / "rq"), "--help"],
    }
    if every_command:
        for name in command_names():
            measured.setdefault(f"redis-lease {name} --help", [lease, name, "--help"])
    return measured


def command_names() -> list[str]:
    """The names of the command line's commands (its groups' own commands aside)."""
    import typer.main

    from redis_lease.cli import app

    group = typer.main.get_command(app)
    return sorted(group.list_commands(typer.Context(group)))  # type: ignore[attr-defined]


#: The commands' environment: bytecode written (the warm-up writes it), as an installed
#: package has it; with ``PYTHONDONTWRITEBYTECODE`` a checkout's modules would be compiled
#: from source on every start, and installed packages (``rq``'s) would not.
ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def wall_time(argv: list[str]) -> float:
    """Seconds from start to exit of ``argv``; its output is dropped, a failure raised."""
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV, check=True)
    return time.perf_counter() - started


def measure(url: str, rounds: int, every_command: bool) -> dict[str, Any]:
    """Medians over ``rounds`` interleaved rounds, with ratios to ``rq --help``."""
    store = LeaseStore.from_url(url, prefix="clistart")
    store.add("r", [Item(f"i{n}", {"n": n}) for n in range(1000)], shards=8)
    measured = commands(url, every_command)
    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {label: [] for label in measured}
    for argv in measured.values():
        wall_time(argv)  # warm: the page cache, Python's bytecode
    for _ in range(rounds):
        for label, argv in measured.items():
            times[label].append(wall_time(argv))
    load_after = os.getloadavg()[0]
    baseline = statistics.median(times[BASELINE])
    return {
        "rounds": rounds,
        "load_average_1m": {"start": round(load_before, 2), "end": round(load_after, 2)},
        "medians_ms": {label: round(statistics.median(t) * 1000, 1) for label, t in times.items()},
        "ratio_to_rq_help": {
            label: round(statistics.median(t) / baseline, 2) for label, t in times.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints its table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--every-command", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder, redis_for(None, Path(folder)) as (url, kind):
        result = measure(url, args.rounds, args.every_command)
        result["redis"] = kind
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    load = result["load_average_1m"]
    print(f"{args.rounds} rounds, load average {load['start']} -> {load['end']}, {kind}")
    print(f"{'command':<40} {'median ms':>10} {'vs rq --help':>13}")
    for label, ms in result["medians_ms"].items():
        print(f"{label:<40} {ms:>10.1f} {result['ratio_to_rq_help'][label]:>12.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
