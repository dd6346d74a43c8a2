"""Test harness: a real Redis for every test, fakeredis as a second backend.

Redis is found in this order: ``REDIS_LEASE_TEST_URL`` (the suite's own variable);
``REDIS_URL``; a Redis answering on 127.0.0.1:6379; a ``redis-server`` started for the
session on a free port.
Under pytest-xdist each worker has a Redis of its own, because RQ keeps global keys
(``rq:*``) that tests on one database share: with a variable set, worker N uses the
variable's database number plus N; else every worker starts its own ``redis-server``.
Under ``CI=true`` a missing real Redis fails the run; it is never skipped.
Each test gets its own key prefix and deletes only keys under it.
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import fakeredis
import pytest
import redis

from redis_lease import LeaseStore
from redis_lease.fleet.transport.shard_jobs import purge_queue
from tests.fleet_helpers import Processes
from tests.redis_cluster import ClusterServers
from tests.redis_server import RedisServer

LOCAL_URL = "redis://127.0.0.1:6379/0"


def _answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _chosen_url() -> tuple[str, str] | None:
    """The Redis a variable names for the suite, and that variable's name; None for none."""
    for variable in ("REDIS_LEASE_TEST_URL", "REDIS_URL"):
        url = os.environ.get(variable)
        if url:
            return url, variable
    return None


def _xdist_worker() -> int | None:
    """This process's pytest-xdist worker number (``gw3`` is 3); None outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def _worker_database(url: str, worker: int) -> str:
    """``url`` with its database number moved up by ``worker`` (each worker has its own)."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path.lstrip("/")
    query = urllib.parse.parse_qs(parts.query)
    if "db" in query:
        query["db"] = [str(int(query["db"][0]) + worker)]
        return parts._replace(query=urllib.parse.urlencode(query, doseq=True)).geturl()
    database = int(path) if path.isdigit() else 0
    return parts._replace(path=f"/{database + worker}").geturl()


def _private_server(directory: Path) -> RedisServer:
    """A started redis-server of the session's own; a new port if another process took one."""
    for attempt in range(3):
        server = RedisServer(directory / f"try-{attempt}")
        server.directory.mkdir()
        try:
            server.start()
        except RuntimeError:
            continue  # the free port was taken between the check and the start
        return server
    pytest.fail("a private redis-server did not start three times: see its redis.log")


#: Whether this run has pytest-xdist workers (set when pytest starts).
_PARALLEL = False


def pytest_configure(config: pytest.Config) -> None:
    """Notes whether the run has pytest-xdist workers, for the header."""
    global _PARALLEL
    _PARALLEL = bool(getattr(config.option, "numprocesses", None))


def pytest_report_header() -> str:
    """Which real Redis the suite writes to, on the header's first lines."""
    from redis_lease.protocol.connection.urls import safe_url

    chosen = _chosen_url()
    if chosen:
        url, variable = chosen
        return f"real Redis: {safe_url(url)} ({variable})"
    if _PARALLEL:
        return "real Redis: a private redis-server for each xdist worker (they share no rq:* keys)"
    if _answers(LOCAL_URL):
        return f"real Redis: {LOCAL_URL} (the one running here; set REDIS_URL for another)"
    return "real Redis: a private redis-server for the session (none on 127.0.0.1:6379)"


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a real Redis server for this session."""
    chosen = _chosen_url()
    worker = _xdist_worker()
    if chosen:
        url, variable = chosen
        if worker:
            url = _worker_database(url, worker)
        if not _answers(url):
            pytest.fail(f"{variable}={url} (this worker's database) does not answer PING")
        yield url
        return
    if worker is None and _answers(LOCAL_URL):
        yield LOCAL_URL
        return
    if shutil.which("redis-server") is None:
        pytest.fail("no Redis: set REDIS_URL, run one on 127.0.0.1:6379, or install redis-server")
    server = _private_server(tmp_path_factory.mktemp("session-redis"))
    yield server.url
    server.stop()


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own."""
    return f"rltest-{uuid.uuid4().hex[:12]}"


def _delete_prefix(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])


@pytest.fixture
def real_store(redis_url: str, prefix: str) -> Iterator[LeaseStore]:
    """A store on the real Redis, under this test's prefix."""
    store = LeaseStore.from_url(redis_url, prefix=prefix)
    yield store
    _delete_prefix(store.client, prefix)
    store.client.close()


@pytest.fixture
def fake_store(prefix: str) -> LeaseStore:
    """A store on a fresh embedded (fakeredis) server."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    return LeaseStore(client, prefix=prefix, url="fakeredis://test")


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServers]:
    """A private 3-primary Redis Cluster for the session, on free loopback ports."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.fail("cluster tests need redis-server and redis-cli: apt-get install redis-server")
    cluster = ClusterServers(tmp_path_factory.mktemp("cluster"))
    cluster.start()
    yield cluster
    cluster.kill()


@pytest.fixture
def cluster_store(
    redis_cluster: ClusterServers, redis_url: str, prefix: str
) -> Iterator[LeaseStore]:
    """A store on the session's cluster, under this test's prefix; RQ on the real Redis
    (RQ does not run on a cluster: the deployment's queue URL)."""
    store = LeaseStore.from_url(redis_cluster.url, prefix=prefix, queue_url=redis_url)
    yield store
    _delete_prefix(store.client, prefix)  # SCAN and DEL fan out over the primaries
    store.close()


BACKENDS = ("redis", "fakeredis", "cluster")


#: Runs of a ``slow`` test (real processes and servers, with their timings) after its first
#: fails: one. The summary line counts them ("N rerun"), so a flaky test stays in sight.
SLOW_RERUNS = 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leaves out the ``store`` backends a test's ``@pytest.mark.backends(...)`` does not name,
    and lets a ``slow`` test run once more when its first run fails (see :data:`SLOW_RERUNS`)."""
    kept, left_out = [], []
    for item in items:
        if item.get_closest_marker("slow") is not None and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=SLOW_RERUNS))
        marker = item.get_closest_marker("backends")
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("store") if callspec is not None else None
        if marker is not None:
            unknown = set(marker.args) - set(BACKENDS)
            assert not unknown, f"{item.nodeid}: unknown backends {sorted(unknown)}"
        if marker is not None and backend is not None and backend not in marker.args:
            left_out.append(item)
        else:
            kept.append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> LeaseStore:
    """The core suite's store: on real Redis, on the embedded backend, on a Redis Cluster.

    ``@pytest.mark.real_redis_only(why)`` skips the embedded run, ``not_on_cluster(why)``
    the cluster run, of a test that needs what the other lacks; ``backends(...)`` names the
    backends of a test in which the others could find no different defect (the others are
    deselected).
    """
    if request.param == "fakeredis":
        marker = request.node.get_closest_marker("real_redis_only")
        if marker is not None:
            pytest.skip(f"fakeredis lacks this: {marker.args[0]}")
        return request.getfixturevalue("fake_store")  # type: ignore[no-any-return]
    if request.param == "cluster":
        marker = request.node.get_closest_marker("not_on_cluster")
        if marker is not None:
            pytest.skip(f"not on a cluster: {marker.args[0]}")
        return request.getfixturevalue("cluster_store")  # type: ignore[no-any-return]
    return request.getfixturevalue("real_store")  # type: ignore[no-any-return]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Starts private redis-server processes (own port, own dir, given config)."""
    started: list[RedisServer] = []

    def start(**config: str) -> RedisServer:
        directory = tmp_path / f"redis-{len(started)}"
        directory.mkdir()
        server = RedisServer(directory, config)
        server.start()
        started.append(server)
        return server

    if shutil.which("redis-server") is None:
        pytest.fail("these tests need redis-server: apt-get install redis-server")
    yield start
    for server in started:
        server.kill()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """The test's processes; every one is killed at teardown."""
    processes = Processes(tmp_path)
    yield processes
    processes.kill_all()


@pytest.fixture
def queue_name(real_store: LeaseStore) -> Iterator[str]:
    """An RQ queue of this test's own, deleted with its jobs afterwards."""
    name = f"{real_store.prefix}-q"
    yield name
    purge_queue(real_store.client, name)
