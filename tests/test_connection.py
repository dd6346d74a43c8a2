"""Connections: URLs checked and masked, ACL refusals, TLS, timeouts and retries.

Refusals are found on private redis-servers (a password, then ACL users with
limits), through the library and through the command line; the shared Redis is
never reconfigured.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from redis_lease import (
    InvalidInput,
    Item,
    LeaseStore,
    PermissionDenied,
    RedisUnavailable,
    TLSFailed,
)
from redis_lease.cli import app
from redis_lease.protocol.connection import tls as tls_module
from redis_lease.protocol.connection.clients import (
    CONNECT_TIMEOUT,
    RETRIES,
    SOCKET_TIMEOUT,
    TLSConnection,
    client_from_url,
    describe,
    resilient,
    with_tls,
)
from redis_lease.protocol.connection.urls import safe_url
from redis_lease.protocol.store.lease_store import CommitRequest
from tests.redis_server import RedisServer

ENV_NAMES = (
    "REDIS_LEASE_URL",
    "REDIS_URL",
    "REDIS_LEASE_PREFIX",
    "REDIS_LEASE_DEBUG",
    "REDIS_LEASE_TLS_CA",
    "REDIS_LEASE_TLS_CERT",
    "REDIS_LEASE_TLS_KEY",
    "REDIS_LEASE_TLS_INSECURE",
)
SECRET = "pw-s3cret"


def cli(url: str, *args: str, prefix: str = "rl") -> Result:
    """Runs the command line in-process."""
    return CliRunner().invoke(
        app, ["--url", url, "--prefix", prefix, *args], env=dict.fromkeys(ENV_NAMES)
    )


def one_error_line(result: Result, code: int) -> str:
    """Asserts the documented exit code and one ``error:`` line; returns the line."""
    assert result.exit_code == code, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output and SECRET not in result.output
    return lines[0]


# -- masking ---------------------------------------------------------------------------

MASKED = [
    (f"redis://user:{SECRET}@h:6379/0", "redis://user:***@h:6379/0"),
    (f"redis://:{SECRET}@h", "redis://:***@h"),
    (f"rediss://:{SECRET}@h:6380/1?ssl_cert_reqs=none", "rediss://:***@h:6380/1?ssl_cert_reqs=none"),
    (f"redis://h:6379/0?password={SECRET}&db=1", "redis://h:6379/0?password=***&db=1"),
    (f"rediss://h?ssl_password={SECRET}", "rediss://h?ssl_password=***"),
    (f"redis+sentinel://:{SECRET}@h1:26379,h2:26379/mymaster",
     "redis+sentinel://:***@h1:26379,h2:26379/mymaster"),
    (f"redis://:{SECRET}@n1:7000,n2:7001,n3:7002/0", "redis://:***@n1:7000,n2:7001,n3:7002/0"),
    (f"redis://:{SECRET}@h:99999", "redis://:***@h:99999"),
    (f"redis://:{SECRET}@h:abc/0", "redis://:***@h:abc/0"),
    (f"redis://u:{SECRET}@[::1", "redis://u:***@[::1"),
    (f"redis://:p@ss{SECRET}@h/0", "redis://:***@h/0"),
    (f"unix://:{SECRET}@/tmp/redis.sock?db=2", "unix://:***@/tmp/redis.sock?db=2"),
    ("redis://h:6379/0?client_name=a@b", "redis://h:6379/0?client_name=a@b"),
    (f"redis://:top#{SECRET}@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
    (f"redis://u:a?b{SECRET}@h:6379/0", "redis://u:***@h:6379/0"),
    (f"redis://{SECRET}@h:6379", "redis://***@h:6379"),
    (f"redis://:pa/ss{SECRET}@h:6379/0?db=1", "redis://:***@h:6379/0?db=1"),
    ("fakeredis://demo", "fakeredis://demo"),
]  # fmt: skip


@pytest.mark.parametrize(("url", "shown"), MASKED)
def test_safe_url_masks_every_secret(url: str, shown: str) -> None:
    assert safe_url(url) == shown


@given(st.text(max_size=80), st.text(min_size=4, max_size=20, alphabet="abcdefXYZ0123"))
def test_safe_url_never_raises_and_never_shows_a_password(text: str, secret: str) -> None:
    safe_url(text)
    for url in (
        f"redis://user:{secret}@{text}",
        f"redis://x{text}?password={secret}",
        f"redis://:{text}{secret}@host:6379/0",
    ):
        assert secret not in safe_url(url).replace(text, "")


# -- malformed URLs: exit 2 -------------------------------------------------------------

MALFORMED = [
    "redis://[::1",
    f"redis://:{SECRET}@h:99999/0",
    f"redis://:{SECRET}@h:abc/0",
    f"redis://:{SECRET}@h:0/0",
    f"redis://:{SECRET}@h/notadb",
    f"redis://:{SECRET}@h:6379/0?db=x",
    f"http://:{SECRET}@h:6379",
    f"redis+sentinel://:{SECRET}@h1:26379,h2:26379",  # no service
    f"redis+sentinel://:{SECRET}@h1:26379/mymaster/x",
    f"rediss+sentinel://:{SECRET}@h1:26379/mymaster",  # TLS to sentinels: not supported
    f"redis+cluster://:{SECRET}@h1:7000,h2:x",
    f"redis+cluster://:{SECRET}@h1:7000,:7001",
    f"redis+cluster://:{SECRET}@h1:7000/2",  # a cluster has database 0 only
    "127.0.0.1:6379",
    f"redis://:top#{SECRET}@127.0.0.1:6379/0",  # an unencoded '#' ends the authority early
    f"redis://:top?{SECRET}@127.0.0.1:6379/0",
]


@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_url_is_invalid_input_with_the_password_masked(url: str) -> None:
    with pytest.raises(InvalidInput) as info:
        LeaseStore.from_url(url)
    assert info.value.exit_code == 2
    assert SECRET not in str(info.value) and "URL" in str(info.value)
    assert "top" not in str(info.value), "no piece of a password is quoted"
    line = one_error_line(cli(url, "status"), 2)
    assert "URL" in line and SECRET not in line


def test_client_defaults_connect_timeout_retries_and_tls_class() -> None:
    client = client_from_url("redis://127.0.0.1:6379/0")
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_connect_timeout"] == CONNECT_TIMEOUT <= 5
    assert kwargs["retry"].get_retries() == RETRIES >= 1
    tls = client_from_url(f"rediss://:{SECRET}@127.0.0.1:6380/0")
    assert tls.connection_pool.connection_class is TLSConnection
    assert SECRET not in describe(tls) and describe(tls) == "rediss://127.0.0.1:6380/0"
    mine = client_from_url("redis://127.0.0.1:6379/0", socket_connect_timeout=1.5)
    assert mine.connection_pool.connection_kwargs["socket_connect_timeout"] == 1.5


def test_resilient_copies_a_client_made_elsewhere(redis_url: str) -> None:
    plain = redis.Redis.from_url(redis_url)  # as RQ makes it: no retries
    copy = resilient(plain)
    assert copy is not plain and copy.ping()
    assert copy.connection_pool.connection_kwargs["retry"].get_retries() == RETRIES
    assert "retry" not in plain.connection_pool.connection_kwargs, "the original is left alone"
    assert describe(copy) == describe(plain)
    copy.close()
    plain.close()
    fake = client_from_url("fakeredis://resilient")
    assert resilient(fake) is fake


# -- ACL refusals (NOPERM): exit 6 ------------------------------------------------------

ADMIN_PASSWORD = "admin-pw"


@pytest.fixture
def acl(private_redis: Callable[..., RedisServer]) -> Callable[..., str]:
    """A private server with a password and a run ``r`` (item ``a``); returns a maker of
    URLs of ACL users with the given rules (on top of a login and ``+@all ~*``)."""
    server = private_redis(requirepass=ADMIN_PASSWORD)
    admin = LeaseStore.from_url(server.url)
    admin.add("r", [Item("a"), Item("b")])
    admin.client.close()

    def user(name: str, *rules: str) -> str:
        with redis.Redis.from_url(server.url) as client:
            client.execute_command("ACL", "SETUSER", name, "reset", "on", f">{SECRET}", *rules)
        return f"redis://{name}:{SECRET}@127.0.0.1:{server.port}/0"

    return user


def refused(call: Callable[[], Any]) -> PermissionDenied:
    with pytest.raises(PermissionDenied) as info:
        call()
    assert info.value.exit_code == 6 and SECRET not in str(info.value)
    assert str(info.value).endswith("(see docs/security.md)"), str(info.value)
    return info.value


def test_a_refused_plain_command_names_it(acl: Callable[..., str]) -> None:
    url = acl("nohget", "~*", "&*", "+@all", "-hget")
    error = refused(lambda: LeaseStore.from_url(url).shard_count("r"))
    assert error.command == "HGET"
    assert str(error) == "the Redis user may not run HGET: grant it (see docs/security.md)"
    line = one_error_line(cli(url, "inspect", "r", "a"), 6)
    assert "may not run HGET: grant it" in line
    assert "unexpected reply" not in line and "refused the login" not in line


def test_a_refused_command_inside_a_script_is_named(acl: Callable[..., str]) -> None:
    url = acl("notime", "~*", "&*", "+@all", "-time")
    store = LeaseStore.from_url(url)
    error = refused(lambda: store.claim("r", "a", "w"))
    message = str(error)  # Redis 7.0 does not say which command; later versions do
    assert "may not run TIME" in message or "a command of script 'claim'" in message, message
    line = one_error_line(cli(url, "claim", "r", "a", "--worker", "w"), 6)
    assert "the Redis user may not run" in line and "grant it (see docs/security.md)" in line


def test_a_refused_key_pattern_says_so(acl: Callable[..., str]) -> None:
    url = acl("otherkeys", "~other:*", "&*", "+@all")
    error = refused(lambda: LeaseStore.from_url(url).run_ids())
    assert "may not access the keys it needs: grant their key pattern" in str(error)
    line = one_error_line(cli(url, "status"), 6)
    assert "may not access the keys" in line


@pytest.mark.parametrize("rule", ["-time", "-hgetall"], ids=["in-a-script", "plain"])
def test_a_refusal_inside_a_pipeline_is_translated(acl: Callable[..., str], rule: str) -> None:
    url = acl(f"pipe{rule[1:]}", "~*", "&*", "+@all", rule)
    store = LeaseStore.from_url(url)
    refused(lambda: store.status("r"))
    line = one_error_line(cli(url, "status", "r"), 6)
    assert "the Redis user may not" in line and "(see docs/security.md)" in line


def test_pipelined_renewals_and_commits_translate_a_refusal(acl: Callable[..., str]) -> None:
    """renew_many and commit_many send their scripts in one pipeline."""
    full = LeaseStore.from_url(acl("full", "~*", "&*", "+@all"))
    lease = full.claim("r", "b", "w", ttl=60)
    limited = LeaseStore(client_from_url(acl("noeval", "~*", "&*", "+@all", "-evalsha")))
    refused(lambda: limited.renew_many([lease], 60))
    # A refused user is not one item's fault: commit_many raises instead of answering per item.
    refused(lambda: limited.commit_many([CommitRequest(lease, {"ok": 1})]))
    assert full.item("r", "b").state == "leased", "nothing was written"


def test_real_login_failures_keep_their_messages(
    acl: Callable[..., str], private_redis: Callable[..., RedisServer]
) -> None:
    good = acl("someone", "~*", "+@all")
    wrong = good.replace(SECRET, "wrong-secret")
    with pytest.raises(RedisUnavailable) as info:
        LeaseStore.from_url(wrong).run_ids()
    assert not isinstance(info.value, PermissionDenied)
    assert "refused the login" in str(info.value) and "check the user and password" in str(
        info.value
    )
    assert "wrong-secret" not in str(info.value)
    no_password = good.replace(f"someone:{SECRET}@", "")
    line = one_error_line(cli(no_password, "status"), 6)
    assert "needs a password" in line


def test_a_refused_login_is_not_retried(private_redis: Callable[..., RedisServer]) -> None:
    server = private_redis(requirepass=ADMIN_PASSWORD)
    admin = redis.Redis.from_url(server.url)

    def connections() -> int:
        return int(admin.info("stats")["total_connections_received"])

    before = connections()
    with pytest.raises(RedisUnavailable):
        LeaseStore.from_url(server.url.replace(ADMIN_PASSWORD, "wrong")).run_ids()
    assert connections() - before == 1, "one login: retrying cannot mend a password"
    admin.close()


# -- TLS against a server that does not speak it ----------------------------------------


def test_rediss_against_a_plain_server_fails_fast_naming_tls(
    private_redis: Callable[..., RedisServer],
) -> None:
    server = private_redis(requirepass=ADMIN_PASSWORD)
    url = f"rediss://:{SECRET}@127.0.0.1:{server.port}/0"
    started = time.monotonic()
    with pytest.raises(TLSFailed) as info:
        LeaseStore.from_url(url).run_ids()
    assert time.monotonic() - started < SOCKET_TIMEOUT  # not waited out
    assert str(info.value).startswith(f"TLS handshake with 127.0.0.1:{server.port} failed")
    assert "is the server TLS-enabled? check the CA, certificate and key" in str(info.value)

    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    done = subprocess.run(
        [sys.executable, "-m", "redis_lease", "--url", url, "status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    took = time.monotonic() - started
    assert done.returncode == 6, done.stderr
    assert took < SOCKET_TIMEOUT, f"took {took:.1f}s"
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: TLS handshake with 127.0.0.1:")
    assert SECRET not in done.stderr


def test_tls_files_become_url_parameters_of_rediss_urls(tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / name for name in ("ca.crt", "my cert.crt", "k.key"))
    for path in (ca, cert, key):
        path.write_text("pem")
    url = with_tls(
        f"rediss://:{SECRET}@h:6380/0?ssl_ca_certs=old&x=1", str(ca), str(cert), str(key)
    )
    client = client_from_url(url)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["ssl_ca_certs"], kwargs["ssl_certfile"]) == (str(ca), str(cert))
    assert kwargs["ssl_keyfile"] == str(key) and kwargs["x"] == "1"
    assert client.connection_pool.connection_class is TLSConnection
    assert with_tls("redis://h:6379/0", None, None, None) == "redis://h:6379/0"


@pytest.mark.parametrize(
    ("url", "files", "needle"),
    [
        ("redis://h:6379/0", {"ca": "CA"}, "--tls-ca applies to TLS only"),
        ("unix:///tmp/r.sock", {"cert": "CERT"}, "is not a rediss:// URL"),
        ("rediss://h:6380/0", {"key": "KEY"}, "--tls-key needs --tls-cert"),
        ("rediss://h:6380/0", {"ca": "missing"}, "cannot be read"),
    ],
)
def test_tls_options_refused_where_they_cannot_work(
    tmp_path: Path, url: str, files: dict[str, str], needle: str
) -> None:
    (tmp_path / "CA").write_text("pem")
    (tmp_path / "CERT").write_text("pem")
    (tmp_path / "KEY").write_text("pem")
    paths = {name: str(tmp_path / value) for name, value in files.items()}
    with pytest.raises(InvalidInput) as info:
        with_tls(url, paths.get("ca"), paths.get("cert"), paths.get("key"))
    assert needle in str(info.value)


def test_tls_url_parameters_on_a_plain_url_are_refused() -> None:
    with pytest.raises(InvalidInput) as info:
        client_from_url(f"redis://:{SECRET}@h:6379/0?ssl_ca_certs=/etc/hosts")
    assert "ssl_ca_certs" in str(info.value) and "rediss://" in str(info.value)
    assert SECRET not in str(info.value)


def test_rediss_clients_verify_the_certificate_and_the_host_by_default() -> None:
    for client in (
        client_from_url("rediss://127.0.0.1:6380/0"),
        resilient(redis.Redis.from_url("rediss://127.0.0.1:6380/0")),
    ):
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["ssl_cert_reqs"], kwargs["ssl_check_hostname"]) == ("required", True)
    stricter = client_from_url("rediss://h:6380/0?ssl_cert_reqs=required&ssl_check_hostname=yes")
    assert stricter.connection_pool.connection_kwargs["ssl_check_hostname"] is True


@pytest.mark.parametrize(
    "param", ["ssl_cert_reqs=none", "ssl_cert_reqs=optional", "ssl_check_hostname=False"]
)
def test_url_parameters_turning_verification_off_need_tls_insecure(
    param: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_LEASE_TLS_INSECURE", raising=False)
    url = f"rediss://:{SECRET}@127.0.0.1:1/0?{param}"
    with pytest.raises(InvalidInput) as info:
        client_from_url(url)
    assert param in str(info.value) and "--tls-insecure" in str(info.value)
    assert one_error_line(cli(url, "runs"), 2).startswith(f"error: {param} turns off TLS")
    # Allowed explicitly: one warning on stderr, then the (refused) connection.
    monkeypatch.setattr(tls_module, "_warned_insecure", False)
    result = CliRunner().invoke(
        app, ["--url", url, "--tls-insecure", "runs"], env=dict.fromkeys(ENV_NAMES)
    )
    assert result.exit_code == 6, result.output
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "TLS verification is off" in warned[0], result.stderr
    assert os.environ.get("REDIS_LEASE_TLS_INSECURE") is None  # restored by the runner


def test_tls_insecure_from_the_environment_allows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_LEASE_TLS_INSECURE", "1")
    monkeypatch.setattr(tls_module, "_warned_insecure", False)
    with pytest.warns(tls_module.InsecureTLSWarning):
        client = client_from_url("rediss://127.0.0.1:6380/0?ssl_check_hostname=false")
    assert client.connection_pool.connection_kwargs["ssl_check_hostname"] is False


def test_a_url_key_file_without_a_certificate_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    key.write_text("pem")
    url = f"rediss://127.0.0.1:6380/0?ssl_keyfile={key}"
    with pytest.raises(InvalidInput) as info:
        client_from_url(url)
    assert "ssl_keyfile needs ssl_certfile" in str(info.value)
    assert "ssl_keyfile needs ssl_certfile" in one_error_line(cli(url, "runs"), 2)
    odd = cli("rediss://127.0.0.1:6380/0?ssl_cert_reqs=OPTIONAL", "runs")
    assert "ssl_cert_reqs=OPTIONAL is not a TLS requirement" in one_error_line(odd, 2)


def test_the_server_clock_in_ms_is_one_formula_for_a_reply_and_a_client(redis_url: str) -> None:
    from redis_lease.protocol.connection.clients import server_ms, time_ms

    assert time_ms((1_700_000_000, 999_999)) == 1_700_000_000_999
    assert time_ms((b"1700000000", b"5000")) == 1_700_000_000_005
    client = redis.Redis.from_url(redis_url)
    before = time_ms(client.time())
    now = server_ms(client)
    assert before <= now <= time_ms(client.time())
    client.close()
