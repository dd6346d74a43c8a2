"""docs/reference/metrics.md cannot drift from the exporter: it is what
scripts/gen-metrics-doc.py makes of the collector's metric families now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from redis_lease import LeaseStore
from redis_lease.operate.metrics.collector import LeaseCollector

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reference" / "metrics.md"
GENERATOR = ROOT / "scripts" / "gen-metrics-doc.py"


def test_the_page_is_what_the_generator_makes_of_the_exporter_now() -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_every_family_a_real_scrape_yields_has_its_row(real_store: LeaseStore) -> None:
    page = DOC.read_text()
    families = list(LeaseCollector(real_store).collect())
    assert len(families) > 30
    for family in families:
        exposed = family.name + ("_total" if family.type == "counter" else "")
        assert f"| `{exposed}` | {family.type} |" in page, exposed


def test_the_generator_refuses_an_unknown_argument() -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--bogus"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (2, "usage: scripts/gen-metrics-doc.py [--check]\n")
