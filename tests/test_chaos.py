"""A short seeded chaos run: faults mixed at random over real processes, each run checked.

The seeds are fixed (``CHAOS_SEED``, ``CHAOS_ITERATIONS`` change them), so a
failure here reproduces with ``make chaos N=1 SEED=<seed> EXAMPLES=0`` (at concurrency 16:
``python -m tests.faults.chaos --concurrency 16 -n 1 --seed <seed>``); the long soak and
its figures are in docs/testing.md.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from tests.faults.chaos import FAULTS, Chaos, chaos_cluster
from tests.faults.cluster import require_faketime

pytestmark = pytest.mark.slow

FIRST_SEED = int(os.environ.get("CHAOS_SEED", "1"))
ITERATIONS = int(os.environ.get("CHAOS_ITERATIONS", "30"))
ITEMS = 48


@pytest.mark.parametrize("concurrency", [1, 16], ids=["c1", "c16"])
def test_a_short_chaos_run_finds_no_violation(
    tmp_path: Path, prefix: str, concurrency: int
) -> None:
    require_faketime()  # two workers run on clocks hours off
    with chaos_cluster(
        tmp_path, prefix, ITEMS, workers=4, skew=True, concurrency=concurrency
    ) as cluster:
        chaos = Chaos(cluster)
        outcomes = [chaos.iteration(seed) for seed in range(FIRST_SEED, FIRST_SEED + ITERATIONS)]
    failures = [
        f"seed {o.seed} (python -m tests.faults.chaos -n 1 --seed {o.seed} "
        f"--concurrency {concurrency}): {o.violation}"
        for o in outcomes
        if o.violation
    ]
    assert not failures, "\n\n".join(failures)
    assert all(o.state == "succeeded" for o in outcomes), [(o.seed, o.state) for o in outcomes]
    injected = Counter(kind for o in outcomes for kind in o.faults)
    # the seeds mix most kinds of fault, and each iteration was checked on real operations
    assert len(injected) >= len(FAULTS) // 2, injected
    assert all(o.operations >= ITEMS for o in outcomes)
    # and the faults met work in flight: leases were taken over, stale calls refused
    assert sum(o.takeovers for o in outcomes) > 0
    assert sum(o.refused for o in outcomes) > 0
