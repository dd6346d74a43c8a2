"""The three ACL users of docs/security.md on a private server with ``requirepass``: each
does its job and is refused beyond it, with one line naming the refused command (exit 6).

The ACL lines are read from the doc's fenced block, so the doc and the test cannot drift.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
import redis
from redis.exceptions import NoPermissionError

from redis_lease import Item, LeaseStore
from redis_lease.operate.dashboard import create_app
from tests.fleet_helpers import REPO, Processes
from tests.redis_server import RedisServer
from tests.security_helpers import FLEET, Cli, fleet_env, fleet_run

pytestmark = pytest.mark.slow

ADMIN_PASSWORD = "default-Pw-7"
USERS = ("worker", "reader", "admin")


def documented_acl_lines(doc: str = "docs/security.md") -> dict[str, str]:
    """The ``ACL SETUSER rl-NAME ...`` lines of ``doc``'s fenced text blocks, by name."""
    text = (REPO / doc).read_text()
    blocks = re.findall(r"```text\n(.*?)```", text, re.DOTALL)
    lines = [line for block in blocks for line in block.splitlines() if "ACL SETUSER" in line]
    found = {line.split()[2].removeprefix("rl-"): line for line in lines}
    assert sorted(found) == sorted(USERS), lines
    return found


def password(user: str) -> str:
    """A password of ``user``'s own."""
    return f"{user}-Secret-{len(user)}x"


@pytest.fixture
def server(private_redis: Callable[..., RedisServer]) -> RedisServer:
    """A private server with ``requirepass`` and the three documented users."""
    started = private_redis(requirepass=ADMIN_PASSWORD)
    default = redis.Redis.from_url(started.url)
    for user, line in documented_acl_lines().items():
        line = line.replace(f">{user.upper()}_PASSWORD", f">{password(user)}")
        default.execute_command(*line.split())  # type: ignore[no-untyped-call]
    default.close()
    return started


def url(server: RedisServer, user: str) -> str:
    """A URL of ``user`` on ``server``."""
    return f"redis://rl-{user}:{password(user)}@127.0.0.1:{server.port}/0"


def cli(server: RedisServer, user: str, env: dict[str, str] | None = None) -> Cli:
    """The CLI as ``user``."""
    return Cli(url(server, user), env=env or {})


def default_client(server: RedisServer) -> redis.Redis:
    """A client of the default user (the server's administrator)."""
    return redis.Redis.from_url(server.url)


def test_worker_user_runs_a_fleet_run_and_nothing_dangerous(
    server: RedisServer, procs: Processes
) -> None:
    env = fleet_env("acl-q")
    worker = cli(server, "worker", env)
    run_id = fleet_run(worker, procs, "acl-q", "2031-06-01")
    status = json.loads(worker.ok("status", run_id, "--json"))
    assert status["counts"]["done"] == 30
    client = redis.Redis.from_url(url(server, "worker"))
    for command in (
        ("FLUSHALL",),
        ("FLUSHDB",),
        ("CONFIG", "SET", "maxmemory", "1"),
        ("KEYS", "*"),
    ):
        with pytest.raises(NoPermissionError):
            client.execute_command(*command)  # type: ignore[no-untyped-call]
    with pytest.raises(NoPermissionError):  # keys beyond its patterns
        client.set("other:key", "1")
    client.close()
    log = default_client(server).acl_log()
    refused = {(e["username"], e["object"]) for e in log}
    # Only what the test tried, and CONFIG GET (the eviction check, skipped quietly).
    allowed = {"flushall", "flushdb", "config|set", "keys", "other:key", "config|get"}
    assert {o for u, o in refused if u == "rl-worker"} <= allowed, log
    assert not [e for e in log if e["username"] != "rl-worker" and e["object"] != "config|get"]


def test_worker_user_is_refused_keys_beyond_its_patterns(server: RedisServer) -> None:
    # Another prefix is outside ~rl:*: the command fails with one line naming the keys.
    for args in (("--prefix", "team2", "add", "r:1", "x"), ("--prefix", "team2", "status")):
        done = cli(server, "worker").run(*args)
        assert done.returncode == 6, done.stderr
        assert done.stderr.strip() == (
            "error: the Redis user may not access the keys it needs: grant their key pattern "
            "(see docs/security.md)"
        )
    assert not default_client(server).keys("team2*")


#: Grants of the documented worker user, each taken away in turn, and what its one line names.
WORKER_GRANTS = [
    ("+client|setname", "may not run CLIENT SETNAME: grant it"),
    ("+client|info", "may not run CLIENT INFO: grant it"),
    ("+subscribe", "may not run SUBSCRIBE: grant it"),
    ("&rq:*", "may not access the channels it needs: grant their channel pattern"),
    ("+hset", "may not run HSET: grant it"),
    ("+sadd", "may not run SADD: grant it"),
    ("~rq:*", "may not access the keys it needs: grant their key pattern"),
    ("+evalsha", "may not run EVALSHA: grant it"),
    ("~rl:*", "may not access the keys it needs: grant their key pattern"),
]


def lacking(server: RedisServer, grant: str) -> Cli:
    """The CLI as ``rl-lacking``: the documented worker user without ``grant``."""
    words = documented_acl_lines()["worker"].split()
    assert grant in words, grant
    words = [w for w in words if w != grant]
    words[2], words[words.index(">WORKER_PASSWORD")] = "rl-lacking", ">lacking-Pw-1"
    default = default_client(server)
    default.execute_command(*words)  # type: ignore[no-untyped-call]
    default.close()
    return Cli(f"redis://rl-lacking:lacking-Pw-1@127.0.0.1:{server.port}/0")


@pytest.mark.parametrize(("grant", "named"), WORKER_GRANTS, ids=[g for g, _ in WORKER_GRANTS])
def test_a_worker_the_acl_refuses_says_one_line_and_never_starts(
    server: RedisServer, grant: str, named: str
) -> None:
    done = lacking(server, grant).run("worker", "--burst", "--queue", "acl-lacking")
    assert done.returncode == 6, done.stdout + done.stderr
    assert done.stderr.splitlines() == [f"error: the Redis user {named} (see docs/security.md)"]
    assert done.stdout == "", "no start line: the worker never started"
    assert not default_client(server).keys("rq:*"), "nothing of the worker was registered"


def test_a_worker_refused_once_started_stops_with_one_line(server: RedisServer) -> None:
    # RQ's dequeue (LMOVE) is first sent after the worker registered, and said so.
    done = lacking(server, "+lmove").run("worker", "--burst", "--queue", "acl-lacking")
    assert done.returncode == 6, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "error: the Redis user may not run LMOVE: grant it (see docs/security.md)"
    ]
    assert done.stdout.startswith("worker ") and len(done.stdout.splitlines()) == 1


def dead_run(server: RedisServer, run_id: str) -> None:
    """A run of two items, ``a`` dead after its one attempt, made by the default user."""
    store = LeaseStore.from_url(server.url)
    store.add(run_id, [Item("a"), Item("b")], max_attempts=1)
    lease = store.claim(run_id, "a", worker="w", ttl=30)
    store.fail(lease, "boom")
    store.client.close()


def test_reader_user_reads_everything_and_changes_nothing(server: RedisServer) -> None:
    dead_run(server, "ops:1")
    reader = cli(server, "reader")
    for args in (
        ("status",),
        ("status", "--json"),
        ("status", "ops:1"),
        ("runs", "--json"),
        ("items", "ops:1"),
        ("dead", "ops:1"),
        ("inspect", "ops:1", "a"),
        ("metrics",),
    ):
        reader.ok(*args)
    assert json.loads(reader.ok("status", "ops:1", "--json"))["counts"]["dead"] == 1
    store = LeaseStore.from_url(url(server, "reader"))
    client = create_app(store, read_only=True).test_client()
    for page in ("/", "/runs/ops:1", "/runs/ops:1/items/a", "/metrics", "/rq/"):
        assert client.get(page).status_code == 200, page
    for page in ("/rq/0/data/queues.json", "/rq/0/data/workers.json"):
        assert client.get(page).status_code == 200, page
    store.client.close()

    for args, command in ((("requeue", "ops:1", "a"), "EVALSHA"), (("cancel", "ops:1"), "EVALSHA")):
        done = reader.run(*args)
        assert done.returncode == 6, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: the Redis user may not run ")
        assert command in lines[0] and "password" not in lines[0].lower()
    assert json.loads(reader.ok("status", "ops:1", "--json"))["counts"]["dead"] == 1


def test_admin_user_requeues_cancels_resumes(server: RedisServer) -> None:
    dead_run(server, "ops:1")
    dead_run(server, "ops:2")
    Cli(server.url).ok("finalize", "ops:2")  # partial: one dead item
    dead_run(server, "ops:3")
    dead_run(server, "ops:4")
    admin = cli(server, "admin")
    admin.ok("requeue", "ops:1", "a")
    assert json.loads(admin.ok("status", "ops:1", "--json"))["counts"]["dead"] == 0
    admin.ok("cancel", "ops:3")
    assert json.loads(admin.ok("status", "ops:3", "--json"))["state"] == "canceled"
    admin.ok("resume", "ops:2", "--deadline", "2h")
    assert json.loads(admin.ok("status", "ops:2", "--json"))["state"] == "running"
    admin.ok("finalize", "ops:4")  # one item dead, one pending: not every item is done
    assert json.loads(admin.ok("status", "ops:4", "--json"))["state"] == "failed"
    client = redis.Redis.from_url(url(server, "admin"))
    for command in (("FLUSHALL",), ("CONFIG", "SET", "maxmemory", "1"), ("KEYS", "*")):
        with pytest.raises(NoPermissionError):
            client.execute_command(*command)  # type: ignore[no-untyped-call]
    with pytest.raises(NoPermissionError):  # RQ's keys are read-only for it
        client.rpush("rq:queue:x", "job")
    client.close()


def test_a_refused_command_is_never_reported_as_a_password_problem(server: RedisServer) -> None:
    done = cli(server, "reader").run("add", "ops:9", "x")
    assert done.returncode == 6
    assert done.stderr.strip() == (
        "error: the Redis user may not run EVALSHA: grant it (see docs/security.md)"
    )
    wrong = Cli(f"redis://rl-reader:not-it@127.0.0.1:{server.port}/0").run("status")
    assert wrong.returncode == 6 and "refused the login" in wrong.stderr
    assert "not-it" not in wrong.stderr


def test_documented_lines_name_no_dangerous_command() -> None:
    for user, line in documented_acl_lines().items():
        words = line.lower().split()
        for command in ("flushall", "flushdb", "keys", "config", "debug", "shutdown", "eval"):
            assert f"+{command}" not in words, (user, command)
        assert "+@all" not in words and "allkeys" not in words and "allcommands" not in words


def test_admin_user_cancels_finalizes_and_resumes_a_jobs_run(server: RedisServer) -> None:
    # A job's run has its job's keys too (its runs index, its state): the admin reaches them.
    worker = cli(server, "worker", fleet_env("acl-jobs"))
    started = [
        str(json.loads(worker.ok("start", FLEET, "--date", day, "--json"))["run"])
        for day in ("2031-07-01", "2031-07-02")
    ]
    admin = Cli(url(server, "admin"), env=fleet_env("acl-jobs"))
    admin.ok("cancel", started[0])
    assert json.loads(admin.ok("status", started[0], "--json"))["state"] == "canceled"
    admin.ok("finalize", started[1])  # nothing was worked: no item is done
    assert json.loads(admin.ok("status", started[1], "--json"))["state"] == "failed"
    admin.ok("resume", started[1], "--deadline", "2h")
    assert json.loads(admin.ok("status", started[1], "--json"))["state"] == "running"
    runs = json.loads(admin.ok("runs", "--json"))
    assert {started[0], started[1]} <= {str(r["run"]) for r in runs}, runs
    log = default_client(server).acl_log()
    assert not [e for e in log if e["username"] == "rl-admin" and e["object"] != "config|get"]
