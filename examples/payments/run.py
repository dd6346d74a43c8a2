"""Nightly payment reconciliation against a loopback HTTP provider, with faults.

    python3 examples/payments/run.py                   # the demo's scenario
    python3 examples/payments/run.py --throttle        # provider tolerates 3 calls in flight
    python3 examples/payments/run.py --no-honour-keys  # provider applies a repeated key again

The job is ``redis_lease.demo.payments:reconcile`` (the one ``redis-lease demo``
runs); the provider is ``redis_lease.demo.provider``. The report's figures are
counted at the provider by idempotency key. Any ``python3`` runs it: where
redis_lease is not installed, it runs itself again with the project's ``.venv``
(``make setup`` makes it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REEXEC_FLAG = "REDIS_LEASE_EXAMPLE_REEXEC"


def use_the_project_venv() -> None:
    """Runs this script again with the project's ``.venv`` when redis_lease is not importable.

    So ``python3 examples/...`` works from any shell once ``make setup`` made the venv.
    """
    try:
        import redis_lease  # noqa: F401
    except ModuleNotFoundError as missing:
        root = Path(__file__).resolve().parents[2]
        venv = root / ".venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        if not venv.exists() or os.environ.get(REEXEC_FLAG):
            sys.exit(
                f"error: {missing.name} is not installed for {sys.executable}: "
                f"run 'make setup' in {root}, then '{venv} {sys.argv[0]}'"
            )
        os.environ[REEXEC_FLAG] = "1"  # once: a broken venv must not loop
        os.execv(venv, [str(venv), str(Path(__file__).resolve()), *sys.argv[1:]])


def main() -> int:
    """Runs the scenario; exit 1 when an effect was applied twice or an item is unfinished."""
    from redis_lease.demo.runner import DemoConfig, run_demo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--throttle", action="store_true", help="provider tolerates 3 in flight")
    parser.add_argument("--no-honour-keys", action="store_true")
    parser.add_argument("--no-faults", action="store_true", help="no paused or killed workers")
    args = parser.parse_args()
    report = run_demo(
        DemoConfig(
            url=args.url,
            items=args.items,
            workers=args.workers,
            faults=not args.no_faults,
            honour_keys=not args.no_honour_keys,
            provider_cap=8,
            provider_max_in_flight=3 if args.throttle else 0,
            latency=0.02 if args.throttle else 0.01,
        ),
        on_backend=lambda text: print(f"backend: {text}", file=sys.stderr),
    )
    print(json.dumps(report, indent=2))
    ok = report["duplicate_effects"] == 0 and report["done"] == report["items"]
    return 0 if ok else 1


if __name__ == "__main__":
    use_the_project_venv()
    sys.exit(main())
