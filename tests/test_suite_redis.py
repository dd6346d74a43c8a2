"""Which Redis the suite writes to: its own variable first, then ``REDIS_URL``."""

from __future__ import annotations

import pytest

from tests import conftest


def test_the_suites_own_variable_wins_over_an_applications_redis_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://app.example:6379/0")
    monkeypatch.setenv("REDIS_LEASE_TEST_URL", "redis://127.0.0.1:6390/3")
    assert conftest._chosen_url() == ("redis://127.0.0.1:6390/3", "REDIS_LEASE_TEST_URL")
    assert conftest.pytest_report_header() == (
        "real Redis: redis://127.0.0.1:6390/3 (REDIS_LEASE_TEST_URL)"
    )
    monkeypatch.delenv("REDIS_LEASE_TEST_URL")
    assert conftest._chosen_url() == ("redis://app.example:6379/0", "REDIS_URL")
    monkeypatch.delenv("REDIS_URL")
    assert conftest._chosen_url() is None
