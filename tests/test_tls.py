"""TLS with client certificates: the fencing story and a fleet run over a private TLS-only
server, and a wrong CA or a plain server refused fast with an error naming TLS (exit 6)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from redis_lease import Item, LeaseLost, LeaseStore
from redis_lease.protocol.connection.clients import SOCKET_TIMEOUT, with_tls
from tests.fleet_helpers import Processes, wait_for
from tests.helpers import wait_past
from tests.redis_server import RedisServer, TlsFiles, free_port, make_certificates
from tests.security_helpers import Cli, fleet_env, fleet_run

pytestmark = pytest.mark.slow

#: ``redis-cli --cluster create`` flags: primaries only, no question asked.
CREATE_FLAGS = ("--cluster-replicas", "0", "--cluster-yes")


def tls_options(files: TlsFiles) -> list[str]:
    """The CLI's global TLS options for ``files``' CA and client certificate."""
    return [
        "--tls-ca",
        str(files.ca),
        "--tls-cert",
        str(files.client_cert),
        "--tls-key",
        str(files.client_key),
    ]


def certificates(directory: Path, names: str | None = None) -> TlsFiles:
    """Certificates made with openssl (``names``: the server's subjectAltName); without
    openssl a skip (a failure under CI=true)."""
    if shutil.which("openssl") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the TLS tests need openssl: apt-get install openssl")
        pytest.skip("openssl is not installed")
    directory.mkdir()
    return make_certificates(directory, names=names)


def start_tls_server(directory: Path, files: TlsFiles) -> RedisServer:
    """A private TLS-only redis-server in ``directory`` serving ``files``' certificate.

    A redis-server built without TLS is a skip (a failure under CI=true); a server
    that fails to start is killed (:meth:`RedisServer.start`).
    """
    directory.mkdir()
    server = RedisServer(directory, tls=files)
    try:
        server.start()
    except RuntimeError as error:  # a redis-server built without TLS
        if os.environ.get("CI") == "true":
            pytest.fail(f"redis-server cannot serve TLS: {error}")
        pytest.skip(f"redis-server cannot serve TLS: {error}")
    return server


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private TLS-only redis-server that asks clients for a certificate of its CA."""
    server = start_tls_server(tmp_path / "redis", certificates(tmp_path / "certs"))
    yield server
    server.kill()


def tls_url(server: RedisServer) -> str:
    """The server's rediss:// URL with its CA and the client certificate as parameters."""
    assert server.tls is not None
    files = server.tls
    return with_tls(server.url, str(files.ca), str(files.client_cert), str(files.client_key))


def test_the_fencing_story_over_tls(tls_server: RedisServer, prefix: str) -> None:
    store = LeaseStore.from_url(tls_url(tls_server), prefix=prefix)
    store.add("fence:tls", [Item("acct_1", {"v": 1})])
    a = store.claim("fence:tls", "acct_1", worker="A", ttl=0.05)
    wait_past(store.client, a.expires_at_ms)
    b = store.claim("fence:tls", "acct_1", worker="B", ttl=60)
    assert b.token > a.token and b.takeover
    with pytest.raises(LeaseLost):
        store.commit(a, {"by": "A"})
    store.commit(b, {"by": "B"})
    record = store.item("fence:tls", "acct_1")
    assert (record.state, record.result) == ("done", {"by": "B"})
    store.client.close()


def test_a_fleet_run_over_tls_with_cli_options(tls_server: RedisServer, procs: Processes) -> None:
    assert tls_server.tls is not None
    worker = Cli(tls_server.url, tls_options(tls_server.tls), fleet_env("tls-q"))
    run_id = fleet_run(worker, procs, "tls-q", "2031-06-02")
    assert json.loads(worker.ok("status", run_id, "--json"))["counts"]["done"] == 30
    # The same options through the environment.
    env = {
        "REDIS_LEASE_TLS_CA": str(tls_server.tls.ca),
        "REDIS_LEASE_TLS_CERT": str(tls_server.tls.client_cert),
        "REDIS_LEASE_TLS_KEY": str(tls_server.tls.client_key),
    }
    assert run_id in Cli(tls_server.url, env=env).ok("runs")


def refused_fast(cli: Cli) -> str:
    """``status`` through ``cli`` fails with exit 6 before the 30 s socket timeout (a
    client that waited for it would be the defect); its one stderr line."""
    started = time.monotonic()
    done = cli.run("status")
    assert time.monotonic() - started < SOCKET_TIMEOUT, "not refused before the timeout"
    assert done.returncode == 6, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "TLS" in lines[0], lines
    return lines[0]


def test_a_wrong_ca_is_refused_fast_naming_tls(tls_server: RedisServer, tmp_path: Path) -> None:
    assert tls_server.tls is not None
    other = certificates(tmp_path / "other")
    options = tls_options(tls_server.tls)
    options[1] = str(other.ca)
    line = refused_fast(Cli(tls_server.url, options))
    assert "certificate verify failed" in line.lower() or "CERTIFICATE_VERIFY" in line
    # A client certificate the server's CA did not sign: the server refuses it.
    refused_fast(Cli(tls_server.url, [*options[:2], *tls_options(other)[2:]]))


def test_a_plain_server_is_refused_fast_naming_tls(
    tmp_path: Path, private_redis: Callable[..., RedisServer]
) -> None:
    files = certificates(tmp_path / "certs")
    plain = private_redis()
    line = refused_fast(Cli(f"rediss://127.0.0.1:{plain.port}/0", tls_options(files)))
    assert "is the server TLS-enabled?" in line


def test_tls_options_need_a_rediss_url_and_readable_files(tmp_path: Path) -> None:
    files = certificates(tmp_path / "certs")
    done = Cli("redis://127.0.0.1:6379/0", tls_options(files)).run("status")
    assert done.returncode == 2 and "rediss://" in done.stderr
    missing = Cli("rediss://127.0.0.1:6379/0", ["--tls-ca", str(tmp_path / "nope.crt")])
    done = missing.run("status")
    assert done.returncode == 2 and "nope.crt" in done.stderr and "cannot be read" in done.stderr


def test_a_certificate_for_another_host_is_refused(tmp_path: Path) -> None:
    files = certificates(tmp_path / "certs", names="IP:127.0.0.2,DNS:other.example")
    server = start_tls_server(tmp_path / "redis", files)
    try:
        line = refused_fast(Cli(server.url, tls_options(files)))
        assert "mismatch" in line.lower() or "hostname" in line.lower(), line
        # Without the host check the same certificate is accepted: the host alone was refused.
        insecure = Cli(f"{server.url}?ssl_check_hostname=false", tls_options(files))
        done = insecure.run("runs")
        assert done.returncode == 2 and "--tls-insecure" in done.stderr  # not without it
        allowed = Cli(
            f"{server.url}?ssl_check_hostname=false", [*tls_options(files), "--tls-insecure"]
        )
        done = allowed.run("runs")
        assert done.returncode == 0, done.stderr
        assert done.stderr.count("warning: TLS verification is off") == 1, done.stderr
    finally:
        server.kill()


def test_a_tls_cluster_works_a_run_and_refuses_an_unknown_ca(tmp_path: Path, prefix: str) -> None:
    """``rediss+cluster://``: three TLS-only primaries (cluster bus over TLS too)."""
    files = certificates(tmp_path / "certs")
    cluster_tls = {"cluster-enabled": "yes", "tls-cluster": "yes", "cluster-node-timeout": "2000"}
    nodes = [RedisServer(tmp_path / f"node-{n}", cluster_tls, tls=files) for n in range(3)]
    try:
        for node in nodes:
            node.directory.mkdir()
            node.config["cluster-config-file"] = str(node.directory / "nodes.conf")
            node.config["cluster-port"] = str(free_port())
            node.start()
        files_args = ["--cacert", str(files.ca), "--cert", str(files.client_cert)]
        files_args += ["--key", str(files.client_key)]
        hosts = [f"127.0.0.1:{node.port}" for node in nodes]
        subprocess.run(
            ["redis-cli", "--tls", *files_args, "--cluster", "create", *hosts, *CREATE_FLAGS],
            check=True,
            capture_output=True,
            timeout=60,
        )
        url = f"rediss+cluster://{','.join(hosts)}"
        cli = Cli(url, ["--prefix", prefix, *tls_options(files)])

        def agreed() -> bool | None:
            return cli.run("runs").returncode == 0 or None

        wait_for(agreed, 30, "the TLS cluster to serve every slot", every=0.2)
        added = cli.run("add", "r", "a", "b", "c", "--shards", "3")
        assert added.returncode == 0, added.stderr
        claimed = cli.run("claim", "r", "a", "-w", "w", "--json")
        token = json.loads(claimed.stdout)["token"]
        assert cli.run("commit", "r", "a", "-t", str(token)).returncode == 0
        status = cli.run("status", "r", "--json")
        assert json.loads(status.stdout)["counts"]["done"] == 1
        line = refused_fast(Cli(url, ["--prefix", prefix]))  # no CA: the server is not trusted
        assert (
            "TLS handshake with rediss+cluster://" in line and "CERTIFICATE_VERIFY_FAILED" in line
        )
    finally:
        for node in nodes:
            node.kill()
