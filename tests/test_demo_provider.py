"""The demo provider's server: a client that goes away mid-request (the demo kills and
pauses workers) is not printed as a traceback; any other failure is logged."""

from __future__ import annotations

import logging

import pytest

from redis_lease.demo.provider import ProviderServer


def _fail_with(error: Exception) -> None:
    """Calls the server's error handler as socketserver does: inside the except block."""
    server = ProviderServer()
    try:
        try:
            raise error
        except Exception:
            server.handle_error(None, ("127.0.0.1", 40000))
    finally:
        server.server_close()


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError(104, "Connection reset by peer"),
        BrokenPipeError(32, "Broken pipe"),
        TimeoutError("timed out"),
    ],
)
def test_a_client_that_went_away_is_not_reported(
    error: Exception, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    _fail_with(error)
    assert capfd.readouterr().err == ""
    assert not caplog.records


def test_any_other_failure_is_logged_not_printed(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="redis_lease.demo.provider"):
        _fail_with(ValueError("bad body"))
    assert "Exception occurred during processing" not in capfd.readouterr().err
    [record] = caplog.records
    assert "127.0.0.1:40000" in record.getMessage() and record.exc_info is not None
