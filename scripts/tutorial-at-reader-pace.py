#!/usr/bin/env python3
"""Runs docs/tutorial.md at a reader's pace: the bank takes its second a payout.

tests/test_snippets.py runs the tutorial with a bank ten times faster (minutes of a
reader's time would be minutes of the suite's), and tests/test_tutorial_numbers.py checks
from the tutorial's own numbers that step 7's timeout covers a reader's pace. This script
runs every block as a reader would, at the reader's pace (about eight minutes: the
blocks follow each other at once, so the kill of step 6 comes early and one worker pays
most of the 400 items), on a private ``redis-server``, and says how long it took.

    .venv/bin/python scripts/tutorial-at-reader-pace.py

Exits 0 when every block ran as the page says, 1 with the failing block otherwise.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis_lease import LeaseStore  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402
from tests.snippets import runner  # noqa: E402
from tests.snippets.parse import read_page  # noqa: E402
from tests.snippets.setups import SETUPS, tutorial  # noqa: E402

#: Seconds one block may take: step 7 waits up to 600.
BLOCK_TIMEOUT = 700.0


def reader_pace(store: LeaseStore, workdir: Path) -> dict[str, str]:
    """The tutorial's setup, with the bank at the reader's pace (no BANK_SECONDS)."""
    env = tutorial(store, workdir)
    env.pop("BANK_SECONDS", None)
    return env


def main() -> int:
    """Runs the page; prints the time it took, or the failing block."""
    runner.TIMEOUT = BLOCK_TIMEOUT
    with tempfile.TemporaryDirectory(prefix="tutorial-") as base:
        (Path(base) / "redis").mkdir()
        server = RedisServer(Path(base) / "redis", {})
        server.start()
        try:
            store = LeaseStore.from_url(server.url, prefix="tutorial")
            workdir = Path(base) / "page"
            workdir.mkdir()
            page = read_page(ROOT, "docs/tutorial.md")
            started = time.monotonic()
            try:
                ran = runner.run_page(page, workdir, store, {**SETUPS, "tutorial": reader_pace})
            except runner.SnippetFailed as failed:
                print(failed, file=sys.stderr)
                return 1
            print(f"docs/tutorial.md: {ran} blocks ran in {time.monotonic() - started:.0f} s")
            return 0
        finally:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
