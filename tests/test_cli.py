"""The redis-lease command line: output, exit codes and one-line errors.

Most tests drive the app in-process with typer's CliRunner, once on the real
Redis and once on the embedded backend (``fakeredis://NAME`` lives only inside
one process). The subprocess tests run the installed command to prove that
errors reach a real shell as one line and the documented exit code.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner, Result

from redis_lease.cli import app
from redis_lease.protocol.connection import clients
from redis_lease.protocol.store.lease_store import LeaseStore
from tests.helpers import server_ms, text, wait_past
from tests.redis_server import RedisServer, free_port

runner = CliRunner()
ENV_NAMES = ("REDIS_LEASE_URL", "REDIS_URL", "REDIS_LEASE_PREFIX", "REDIS_LEASE_DEBUG")


@dataclass
class Cli:
    """Runs commands in-process against one backend under one prefix."""

    url: str
    prefix: str
    client: redis.Redis

    def __call__(self, *args: str, env: dict[str, str | None] | None = None) -> Result:
        cleared: dict[str, str | None] = dict.fromkeys(ENV_NAMES)
        return runner.invoke(
            app, ["--url", self.url, "--prefix", self.prefix, *args], env={**cleared, **(env or {})}
        )

    def ok(self, *args: str) -> Any:
        """Runs a command with --json, asserts success, returns the parsed stdout."""
        result = self(*args, "--json")
        assert result.exit_code == 0, result.output
        assert result.stderr == ""
        return json.loads(result.stdout)

    def keys(self) -> list[bytes]:
        """Every key under this prefix."""
        return sorted(self.client.scan_iter(match=f"{self.prefix}:*", count=1000))

    def snapshot(self) -> dict[bytes, bytes | None]:
        """The serialized value of every key under this prefix."""
        return {key: self.client.dump(key) for key in self.keys()}


def assert_error(result: Result, code: int, *words: str) -> None:
    """The command failed with ``code``: one stderr line, no traceback, nothing on stdout."""
    assert result.exit_code == code, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture(params=["redis", "fakeredis"])
def cli(request: pytest.FixtureRequest, prefix: str) -> Iterator[Cli]:
    """The CLI on the real Redis, then on the embedded backend."""
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
    else:
        url = f"fakeredis://{prefix}"
    client = clients.client_from_url(url)
    yield Cli(url, prefix, client)
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)
    client.close()
    clients._fake_servers.pop(prefix, None)


@pytest.fixture
def real_cli(redis_url: str, prefix: str) -> Iterator[Cli]:
    """The CLI on the real Redis only."""
    client = redis.Redis.from_url(redis_url)
    yield Cli(redis_url, prefix, client)
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)
    client.close()


def parse_time(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    assert moment.utcoffset() == timedelta(0), text
    return moment


# -- the walkthrough ----------------------------------------------------------


def test_claim_commit_walkthrough_json(cli: Cli) -> None:
    added = cli.ok("add", "nightly:2026-12-02", "acct_1", "acct_2", "--payload", '{"v": 7}')
    assert added == {"run": "nightly:2026-12-02", "added": 2, "existing": 0, "shards": 1}
    again = cli.ok("add", "nightly:2026-12-02", "acct_1")
    assert (again["added"], again["existing"]) == (0, 1)

    before = datetime.now(UTC)
    lease = cli.ok("claim", "nightly:2026-12-02", "acct_1", "--worker", "w1", "--ttl", "120")
    assert lease["run"] == "nightly:2026-12-02" and lease["item"] == "acct_1"
    assert lease["token"] >= 1 and lease["attempt"] == 1
    assert lease["payload"] == {"v": 7} and lease["lease_id"]
    expires = parse_time(lease["expires_at"])
    assert before + timedelta(seconds=60) < expires < before + timedelta(seconds=180)

    token = str(lease["token"])
    holder = ["--token", token, "--lease-id", lease["lease_id"]]
    renewed = cli.ok("renew", "nightly:2026-12-02", "acct_1", *holder, "--ttl", "300")
    assert parse_time(renewed["expires_at"]) > expires

    result = '{"released": 3}'
    committed = cli.ok("commit", "nightly:2026-12-02", "acct_1", *holder, "--result", result)
    assert committed["repeated"] is False and committed["result"] == {"released": 3}
    repeated = cli.ok("commit", "nightly:2026-12-02", "acct_1", "--token", token)
    assert repeated["repeated"] is True and repeated["result"] == {"released": 3}

    record = cli.ok("inspect", "nightly:2026-12-02", "acct_1")
    assert record["state"] == "done" and record["result"] == {"released": 3}
    assert record["owner"] == "w1" and record["token"] == lease["token"]
    status = cli.ok("status", "nightly:2026-12-02")
    assert status["counts"] == {"pending": 1, "leased": 0, "done": 1, "dead": 0}


def test_claim_without_item_takes_the_next_due(cli: Cli) -> None:
    cli.ok("add", "r", "a", "b", "--shards", "2")
    first = cli.ok("claim", "r", "--worker", "w1")
    second = cli.ok("claim", "r", "--worker", "w2")
    assert {first["item"], second["item"]} == {"a", "b"}
    assert_error(cli("claim", "r", "--worker", "w3"), 4, "nothing is due")


def test_human_output(cli: Cli) -> None:
    assert cli("add", "r", "a").stdout.strip() == "run r: 1 added, 0 already there"
    result = cli("claim", "r", "a", "-w", "w1")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("claimed a of run r: token 1, lease id ")
    status = cli("status", "r")
    assert status.exit_code == 0 and "leased" in status.stdout and "run r" in status.stdout
    listing = cli("status")
    assert listing.exit_code == 0, listing.output
    assert re.search(r"\br\b.*\brunning\b.*\b1\b", listing.stdout), listing.stdout


# -- lease errors -------------------------------------------------------------


def test_stale_token_commit_is_refused_with_exit_3(cli: Cli) -> None:
    cli.ok("add", "r", "a")
    old = cli.ok("claim", "r", "a", "-w", "w1")
    cli.ok("release", "r", "a", "--token", str(old["token"]))
    new = cli.ok("claim", "r", "a", "-w", "w2")
    assert new["token"] > old["token"]
    keys = cli.keys()
    (counts_key,) = [key for key in keys if key.endswith(b":counts")]
    before = cli.snapshot()
    counts_before = cli.client.hgetall(counts_key)

    result = cli("commit", "r", "a", "--token", str(old["token"]), "--result", '{"x": 1}')
    assert_error(result, 3, "lease lost")
    wrong_id = cli("commit", "r", "a", "--token", str(new["token"]), "--lease-id", "other")
    assert_error(wrong_id, 3, "lease lost")
    assert_error(cli("renew", "r", "a", "--token", str(old["token"])), 3)
    assert_error(cli("fail", "r", "a", "--token", str(old["token"]), "--error", "x"), 3)

    record = cli.ok("inspect", "r", "a")
    assert (record["state"], record["token"], record["owner"]) == ("leased", new["token"], "w2")
    # Only the refusal counters moved (in the shard's counts hash): four refusals, two commits;
    # the attempt log (a stream) records the refusals.
    after = {k: v for k, v in cli.snapshot().items() if not k.endswith(b":attempts")}
    before = {k: v for k, v in before.items() if not k.endswith(b":attempts")}
    changed = {key for key, value in after.items() if value != before.get(key)}
    assert set(after) == set(before) and changed == {counts_key}
    counts_after = cli.client.hgetall(counts_key)
    moved = {
        text(field): int(counts_after[field]) - int(counts_before.get(field, 0))
        for field in counts_after
        if counts_after[field] != counts_before.get(field)
    }
    assert moved == {"stale_refused": 4, "stale_commits": 2}


def test_expired_lease_is_taken_over_and_the_old_token_is_stale(cli: Cli) -> None:
    cli.ok("add", "r", "a")
    old = cli.ok("claim", "r", "a", "-w", "w1", "--ttl", "0.05")
    deadline = time.monotonic() + 10
    while True:
        result = cli("claim", "r", "a", "-w", "w2", "--json")
        if result.exit_code == 0:
            break
        assert_error(result, 4, "not claimable")
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.02)
    new = json.loads(result.stdout)
    assert new["takeover"] is True and new["attempt"] == 2
    assert_error(cli("commit", "r", "a", "--token", str(old["token"])), 3, "lease lost")
    assert cli.ok("commit", "r", "a", "--token", str(new["token"]))["repeated"] is False


def test_claiming_a_held_item_exits_4(cli: Cli) -> None:
    cli.ok("add", "r", "a")
    held = cli.ok("claim", "r", "a", "-w", "w1")
    assert_error(cli("claim", "r", "a", "-w", "w2"), 4, "not claimable", "leased")
    assert cli.ok("inspect", "r", "a")["token"] == held["token"]


def test_unknown_run_or_item_exits_5(cli: Cli) -> None:
    assert_error(cli("status", "nope"), 5, "nope")
    assert_error(cli("claim", "nope", "-w", "w1"), 5)
    cli.ok("add", "r", "a")
    assert_error(cli("claim", "r", "zz", "-w", "w1"), 5, "zz")
    assert_error(cli("inspect", "r", "zz"), 5, "zz")
    assert_error(cli("commit", "r", "zz", "--token", "1"), 5)


def test_fail_retry_dead_and_requeue(cli: Cli) -> None:
    cli.ok("add", "r", "a", "b")
    a = cli.ok("claim", "r", "a", "-w", "w1")
    retry = cli.ok("fail", "r", "a", "--token", str(a["token"]), "--error", "provider 503")
    assert retry["state"] == "retry" and retry["attempts"] == 1
    b = cli.ok("claim", "r", "b", "-w", "w1")
    dead = cli.ok("fail", "r", "b", "-t", str(b["token"]), "-e", "bad account", "--permanent")
    assert dead["state"] == "dead"
    record = cli.ok("inspect", "r", "b")
    assert record["state"] == "dead" and record["error"] == "bad account"
    assert cli.ok("requeue", "r", "b") == {"run": "r", "requeued": 1}
    assert cli.ok("inspect", "r", "b")["state"] == "pending"


def test_reap_moves_expired_leases_back(cli: Cli) -> None:
    cli.ok("add", "r", "a")
    cli.ok("claim", "r", "a", "-w", "w1", "--ttl", "0.05")
    deadline = time.monotonic() + 10
    while (reaped := cli.ok("reap", "r"))["pending"] == 0:
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.02)
    assert reaped == {"run": "r", "pending": 1, "dead": 0}
    assert cli.ok("inspect", "r", "a")["state"] == "pending"


# -- status -------------------------------------------------------------------


def test_status_json_fields(cli: Cli) -> None:
    added_from = server_ms(cli.client)
    cli.ok("add", "r1", "a", "b", "c", "--shards", "3")
    added_to = server_ms(cli.client)
    cli.ok("add", "r2", "x")
    wait_past(cli.client, added_to + 300)  # b and c wait a while, then a is claimed
    claimed_from = server_ms(cli.client)
    cli.ok("claim", "r1", "a", "-w", "w1")
    claimed_to = server_ms(cli.client)
    wait_past(cli.client, claimed_to + 100)
    read_from = server_ms(cli.client)
    status = cli.ok("status", "r1")
    read_to = server_ms(cli.client)
    assert status["run"] == "r1" and status["shards"] == 3
    assert status["counts"] == {"pending": 2, "leased": 1, "done": 0, "dead": 0}
    # Ages on the server clock: due since the add, leased since the claim (ms brackets).
    eligible = status["oldest_eligible_age_seconds"] * 1000
    assert read_from - added_to - 1e-6 <= eligible <= read_to - added_from + 1e-6
    leased = status["oldest_leased_age_seconds"] * 1000
    assert read_from - claimed_to - 1e-6 <= leased <= read_to - claimed_from + 1e-6
    listing = cli.ok("status")
    assert [s["run"] for s in listing] == ["r1", "r2"]
    assert listing[1]["counts"] == {"pending": 1, "leased": 0, "done": 0, "dead": 0}


# -- bad input writes nothing -------------------------------------------------

BAD_INPUT = [
    ("add", "bad id", "a"),
    ("add", "r", "a{b}"),
    ("add", "r", ""),
    ("add", "r", "a", "--payload", "{bad"),
    ("add", "r", "a", "--payload", "NaN"),
    ("add", "r", "a", "--shards", "0"),
    ("claim", "r", "a", "-w", "w1", "--ttl", "-1"),
    ("claim", "r", "-w", "w1", "--ttl", "0"),
    ("claim", "r", "a", "-w", "bad worker"),
    ("commit", "r", "a", "--token", "1", "--result", "not json"),
    ("commit", "r", "a", "--token", "0"),
    ("commit", "r", "a", "--token", "abc"),
    ("fail", "r", "a", "--token", "1", "--error", " "),
    ("renew", "r", "a", "--token", "1", "--ttl", "-5"),
    ("claim", "r", "a"),
    ("frobnicate",),
]


@pytest.mark.parametrize("args", BAD_INPUT, ids=lambda a: " ".join(a) or "empty")
def test_bad_input_exits_2_and_writes_nothing(cli: Cli, args: tuple[str, ...]) -> None:
    assert_error(cli(*args), 2)
    assert cli.keys() == []


def test_bad_input_leaves_an_existing_run_unchanged(cli: Cli) -> None:
    cli.ok("add", "r", "a")
    lease = cli.ok("claim", "r", "a", "-w", "w1")
    before = cli.snapshot()
    token = str(lease["token"])
    assert_error(cli("commit", "r", "a", "--token", token, "--result", "{"), 2, "result")
    assert_error(cli("renew", "r", "a", "--token", token, "--ttl", "-1"), 2, "ttl")
    assert_error(cli("add", "r", "b", "--payload", "[1,"), 2, "payload")
    assert_error(cli("add", "r", "b", "--shards", "4"), 2, "shards")
    assert cli.snapshot() == before


# -- connection failures and other errors --------------------------------------


def test_unreachable_redis_exits_6(prefix: str) -> None:
    cli = Cli(f"redis://127.0.0.1:{free_port()}/0", prefix, redis.Redis())
    assert_error(cli("status"), 6, "unreachable")
    assert_error(cli("claim", "r", "a", "-w", "w1"), 6)


def test_wrong_password_exits_6(private_redis: Callable[..., RedisServer], prefix: str) -> None:
    server = private_redis(requirepass="s3cret")
    good = Cli(server.url, prefix, redis.Redis.from_url(server.url))
    assert good.ok("add", "r", "a")["added"] == 1
    wrong = Cli(f"redis://:nope@127.0.0.1:{server.port}/0", prefix, good.client)
    assert_error(wrong("status", "r"), 6, "refused")
    assert "nope" not in wrong("status", "r").stderr  # the password is not echoed
    anonymous = Cli(f"redis://127.0.0.1:{server.port}/0", prefix, good.client)
    assert_error(anonymous("claim", "r", "a", "-w", "w1"), 6)
    good.client.close()


def test_eviction_policy_is_a_danger_line_at_startup(
    private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    server = private_redis(**{"maxmemory-policy": "allkeys-lru"})
    result = Cli(server.url, prefix, redis.Redis())("status", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []
    assert result.stderr.startswith("danger: ") and "noeviction" in result.stderr
    assert "allkeys-lru" in result.stderr and "lost" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_unexpected_error_exits_1_in_one_line(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: LeaseStore, run_id: str) -> None:
        raise RuntimeError("disk on fire\nsecond line")

    cli.ok("add", "r", "a")
    monkeypatch.setattr(LeaseStore, "status", broken)
    assert_error(cli("status", "r"), 1, "unexpected RuntimeError: disk on fire second line")


def test_url_comes_from_the_environment(cli: Cli) -> None:
    cli.ok("add", "r", "a")
    bad = f"redis://127.0.0.1:{free_port()}/0"
    args = ["--prefix", cli.prefix, "status", "r", "--json"]
    first = runner.invoke(app, args, env={"REDIS_LEASE_URL": cli.url, "REDIS_URL": bad})
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["counts"]["pending"] == 1
    fallback = runner.invoke(app, args, env={"REDIS_LEASE_URL": None, "REDIS_URL": cli.url})
    assert fallback.exit_code == 0, fallback.output
    unreachable = runner.invoke(app, args, env={"REDIS_LEASE_URL": bad, "REDIS_URL": cli.url})
    assert_error(unreachable, 6)
    by_env = runner.invoke(
        app, ["--url", cli.url, "status", "r"], env={"REDIS_LEASE_PREFIX": cli.prefix}
    )
    assert by_env.exit_code == 0, by_env.output


def test_the_default_url_is_named_on_stderr_only_when_taken(cli: Cli) -> None:
    cleared: dict[str, str | None] = dict.fromkeys(ENV_NAMES)
    taken = runner.invoke(app, ["--prefix", cli.prefix, "runs", "--json"], env=cleared)
    assert taken.exit_code == 0, taken.output
    assert taken.stderr == (
        "using redis://127.0.0.1:6379/0 (no --url, REDIS_LEASE_URL or REDIS_URL given)\n"
    )
    assert json.loads(taken.stdout) == []
    given = cli("runs", "--json")
    assert given.exit_code == 0, given.output
    assert given.stderr == ""
    by_env = runner.invoke(
        app, ["--prefix", cli.prefix, "runs"], env={**cleared, "REDIS_URL": cli.url}
    )
    assert by_env.exit_code == 0, by_env.output
    assert by_env.stderr == ""


def test_a_global_option_after_the_command_says_to_put_it_first(cli: Cli) -> None:
    assert_error(
        cli("runs", "--url", cli.url),
        2,
        "--url is a global option: put it before the command",
        "--url ... runs ...",
    )
    assert_error(cli("schedule", "show", "--prefix", "p"), 2, "--prefix ... schedule show ...")
    assert_error(cli("runs", "--bogus"), 2, "No such option: --bogus")


# -- the installed command, in real processes -----------------------------------


def command() -> list[str]:
    script = Path(sys.executable).with_name("redis-lease")
    return [str(script)] if script.exists() else [sys.executable, "-m", "redis_lease"]


def shell(
    url: str, prefix: str, *args: str, module: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    base = [sys.executable, "-m", "redis_lease"] if module else command()
    return subprocess.run(
        [*base, "--url", url, "--prefix", prefix, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def assert_process_error(done: subprocess.CompletedProcess[str], code: int, word: str) -> None:
    assert done.returncode == code, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and word in lines[0], done.stderr


def test_installed_command_walkthrough_and_exit_codes(real_cli: Cli) -> None:
    url, prefix = real_cli.url, real_cli.prefix
    added = shell(url, prefix, "add", "r", "a", "b", "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["added"] == 2

    claimed = shell(url, prefix, "claim", "r", "a", "--worker", "w1", "--json")
    assert claimed.returncode == 0 and claimed.stderr == "", claimed.stderr
    lease = json.loads(claimed.stdout)
    assert {"run", "item", "token", "lease_id", "expires_at", "attempt", "payload"} <= set(lease)

    assert_process_error(shell(url, prefix, "claim", "r", "a", "-w", "w2"), 4, "not claimable")
    stale = shell(url, prefix, "commit", "r", "a", "--token", str(lease["token"] + 1))
    assert_process_error(stale, 3, "lease lost")
    assert_process_error(shell(url, prefix, "inspect", "r", "zz"), 5, "not found")
    bad = shell(url, prefix, "add", "r", "c", "--payload", "{oops", module=True)
    assert_process_error(bad, 2, "not valid JSON")
    assert_process_error(shell(url, prefix, "claim", "r", "-w", "w1", "--ttl", "-1"), 2, "ttl")
    assert_process_error(shell(url, prefix, "claim", "r"), 2, "--worker")

    done = shell(url, prefix, "commit", "r", "a", "--token", str(lease["token"]), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["repeated"] is False
    status = json.loads(shell(url, prefix, "status", "r", "--json").stdout)
    assert status["counts"] == {"pending": 1, "leased": 0, "done": 1, "dead": 0}
    assert real_cli.client.hlen(f"{prefix}:{{r#0}}:items") == 2  # 'c' was never written


def test_installed_command_unreachable_redis(prefix: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    assert_process_error(shell(url, prefix, "status"), 6, "unreachable")
    assert_process_error(shell(url, prefix, "claim", "r", "-w", "w", module=True), 6, "127.0.0.1")
    # Bad input is reported before any connection is tried.
    assert_process_error(shell(url, prefix, "add", "r", "a b"), 2, "item id")


def test_installed_command_wrong_password(
    private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    server = private_redis(requirepass="s3cret")
    done = shell(f"redis://:wrong@127.0.0.1:{server.port}/0", prefix, "status")
    assert_process_error(done, 6, "refused")


def test_help_lists_the_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    names = ("add", "claim", "renew", "commit", "fail", "release", "status", "inspect", "runs")
    for name in (*names, "items", "dead", "resolve-effect", "requeue", "reap"):
        assert re.search(rf"\b{name}\b", result.stdout), name
