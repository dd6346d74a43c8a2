"""Nightly payment reconciliation against a loopback HTTP provider, with faults.

    python examples/payments/run.py                    # the demo's scenario
    python examples/payments/run.py --throttle         # provider tolerates 3 calls in flight
    python examples/payments/run.py --no-honour-keys   # provider applies a repeated key again

The job is ``redis_lease.demo.payments:reconcile`` (the one ``redis-lease demo``
runs); the provider is ``redis_lease.demo.provider``. The report's figures are
counted at the provider by idempotency key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from redis_lease.demo.runner import DemoConfig, run_demo


def main() -> int:
    """Runs the scenario; exit 1 when an effect was applied twice or an item is unfinished."""
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
    sys.exit(main())
