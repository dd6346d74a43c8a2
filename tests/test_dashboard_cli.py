"""``redis-lease dashboard``: what it refuses before serving, and the real server.

Each case runs the command as a process, as an operator would: a refusal is one
``error:`` line and exit 2 (bad usage); the server prints where it listens once it
does, then answers ``/`` and ``/healthz``.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from redis_lease import LeaseStore
from redis_lease.errors import InvalidInput
from redis_lease.operate.dashboard.server import allowed_hosts, check_exposure, is_loopback
from redis_lease.protocol.leases import Item
from tests.fleet_helpers import REPO, Processes, wait_for

LISTENING = re.compile(r"serving the dashboard on (http://127\.0\.0\.1:(\d+)/)")
AUTH_ENV = ("REDIS_LEASE_DASHBOARD_USER", "REDIS_LEASE_DASHBOARD_PASSWORD")


def dashboard(redis_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs ``redis-lease dashboard ARGS`` to its end (for refusals)."""
    env = {k: v for k, v in os.environ.items() if k not in AUTH_ENV}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "redis_lease",
            "--url",
            redis_url,
            "--prefix",
            prefix,
            "dashboard",
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert "serving" not in result.stderr


def test_a_bind_beyond_loopback_needs_a_login_or_insecure(redis_url: str, prefix: str) -> None:
    refused = dashboard(redis_url, prefix, "--bind", "0.0.0.0", "--port", "0")
    assert_refused(refused, "--bind 0.0.0.0", "--user", "--password", "--insecure")
    half = dashboard(redis_url, prefix, "--user", "ops", "--port", "0")
    assert_refused(half, "both --user and --password")


def test_behind_a_proxy_needs_a_login_or_insecure(redis_url: str, prefix: str) -> None:
    refused = dashboard(redis_url, prefix, "--behind-proxy", "--port", "0")
    assert_refused(refused, "--behind-proxy", "--user", "--password", "--insecure")
    with pytest.raises(InvalidInput, match="--behind-proxy"):
        check_exposure("127.0.0.1", auth=False, insecure=False, behind_proxy=True)
    check_exposure("127.0.0.1", auth=True, insecure=False, behind_proxy=True)
    check_exposure("127.0.0.1", auth=False, insecure=True, behind_proxy=True)


@pytest.mark.parametrize(
    ("bind", "behind_proxy", "hosts"),
    [
        ("127.0.0.1", False, ("localhost", "127.0.0.1", "::1")),
        ("127.0.0.2", False, ("localhost", "127.0.0.1", "::1", "127.0.0.2")),
        ("::1", False, ("localhost", "127.0.0.1", "::1")),
        ("127.0.0.1", True, None),
        ("0.0.0.0", False, None),
    ],
)
def test_which_hosts_the_dashboard_answers_to(
    bind: str, behind_proxy: bool, hosts: tuple[str, ...] | None
) -> None:
    assert allowed_hosts(bind, behind_proxy=behind_proxy) == hosts


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("dashboard.internal", False),
    ],
)
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    if loopback:
        check_exposure(host, auth=False, insecure=False)
    else:
        with pytest.raises(InvalidInput):
            check_exposure(host, auth=False, insecure=False)
        check_exposure(host, auth=True, insecure=False)
        check_exposure(host, auth=False, insecure=True)


def test_a_port_in_use_is_a_clear_error(redis_url: str, prefix: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = dashboard(redis_url, prefix, "--port", str(port))
    assert_refused(result, f"cannot listen on 127.0.0.1:{port}", "--port")


@pytest.mark.slow
def test_the_command_serves_the_dashboard(
    redis_url: str, real_store: LeaseStore, procs: Processes
) -> None:
    real_store.add("served:1", [Item("a")])
    args = [sys.executable, "-m", "redis_lease", "--url", redis_url, "--prefix", real_store.prefix]
    procs.start([*args, "dashboard", "--port", "0", "--read-only"], {}, "dashboard")

    def listening() -> str | None:
        found = LISTENING.search(procs.log("dashboard"))
        return found.group(1) if found else None

    base = wait_for(listening, 30, "the listening line")
    with urllib.request.urlopen(base, timeout=10) as response:
        page = response.read().decode()
        assert response.status == 200
    assert 'data-run="served:1"' in page and '<table id="runs">' in page
    with urllib.request.urlopen(base + "healthz", timeout=10) as response:
        assert (response.status, response.read()) == (200, b"ok\n")
    rebound = urllib.request.Request(base, headers={"Host": "evil.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(rebound, timeout=10)
    refused.value.close()
    assert refused.value.code == 400
