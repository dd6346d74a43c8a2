"""Fuzzing the ``redis-lease`` command line with hypothesis: generated argument lists.

Each example starts from the protocol fuzz's scene (a run with an item in every state) and
runs one command of the app in-process (typer's CliRunner), picked from the real command
list, with generated positionals and options: the scene's ids or ids that are empty, long
(200, 5000 characters), with spaces, braces, unicode or lone surrogates (as a shell hands
undecodable bytes to Python), looking like options; JSON of random shapes or not JSON;
numbers in every form; dates and deadlines valid, impossible or huge; job paths that do not
import (also relative ones); unknown options, extra arguments, global options in the wrong
place, missing required options, ``--help``; files of items for ``add --from-file`` (good,
bad on a late line, empty, missing, not UTF-8) and ``@FILE`` payloads; page cursors.

Checked for every command line: the output never holds a traceback; the exit code is a
documented one (0, 2-7; exit 1 means "unexpected" and is a finding here); a failure is one
``error: ...`` line on stderr (``warning:``/``danger:`` lines aside), or typer's usage text
for exit 2; exit 2 wrote nothing (DUMP of every key); ``--json`` success prints JSON.

``worker`` and ``demo`` (long-running processes) and ``metrics --serve`` are left out. On
the embedded backend (``fakeredis://NAME``, its whole server this test's own) a real job
path is generated too (``tests.fleet_jobs:fleet``: ``start``, ``tick``, ``schedule``); on the
shared Redis only job paths that fail to import, so nothing is written outside the prefix.

Budget: 100 examples on fakeredis and 40 on the real Redis, about 8 s on 2 cores (see
tests/fuzz_values.py: ``FUZZ_EXAMPLES=N`` runs N examples per test).
"""

from __future__ import annotations

import json
import string
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import event, given
from typer.testing import CliRunner

from redis_lease import LeaseStore
from redis_lease.cli import app
from redis_lease.protocol.connection import clients
from tests.fuzz_values import (
    JSON_VALUES,
    NEAR_JSON,
    NOT_UTF8,
    fuzz_settings,
    mostly,
    numbers,
    valid_ids,
)
from tests.test_cli import ENV_NAMES
from tests.test_fuzz_protocol import FuzzScene
from tests.test_hostile_protocol import RUN

runner = CliRunner()
#: A lone surrogate is how Python hands a command line's undecodable byte to the program.
SURROGATES = ["\udcff", "a\udce9b"]
ODD_TEXT = ["", " ", "a b", "-x", "--json", "caf\u00e9", "x" * 201, "x" * 5000, "{", "a\nb", "#"]
DATES = [
    "2026-12-02", "2026-13-01", "2026-02-30", "2024-02-29", "", "20261202", "9999-12-31",
    "0001-01-01", "2026-12-02T00:00", "\u0662\u0660\u0662\u0666-12-02", "-1", "x",
]  # fmt: skip
#: Job paths that cannot import (relative, empty parts, missing modules, not a Job).
BAD_JOBS = [
    "", ":", "x", ".x:y", "..:a", ":fleet", "tests.fleet_jobs:", "a..b:c", "nosuch_fz_mod:job",
    "tests.fleet_jobs:nope", "redis_lease.fleet.jobs.job:Job", "tests.fleet_jobs:fleet:x",
    "x\x00:y",
]  # fmt: skip
REAL_JOB = "tests.fleet_jobs:fleet"


def hostile_text() -> st.SearchStrategy[str]:
    """Command-line text that no id, number or JSON argument should accept as it is."""
    return st.one_of(
        st.sampled_from(ODD_TEXT + SURROGATES),
        st.text(max_size=12),
        st.sampled_from(NOT_UTF8).map(lambda b: b.decode(errors="surrogateescape")),
    )


def json_args() -> st.SearchStrategy[str]:
    """JSON text of random shapes, deep, large, or almost JSON."""
    deep = st.sampled_from([32, 33, 2000]).map(lambda d: "[" * d + "]" * d)
    return mostly(
        JSON_VALUES.map(json.dumps),
        st.one_of(st.sampled_from(NEAR_JSON), deep, hostile_text(), st.just("x" * 70_000)),
    )


def number_args(usual: list[str]) -> st.SearchStrategy[str]:
    """Numbers the option takes, else numbers in every form as text."""
    return mostly(st.sampled_from(usual), numbers().map(str) | hostile_text())


def deadlines() -> st.SearchStrategy[str]:
    """Durations and ISO times: valid, past, without a timezone, huge, not times."""
    duration = st.builds(
        "{}{}".format, st.integers(0, 10**20) | st.sampled_from([1, 2, 90]), st.sampled_from("smhd")
    )
    iso = st.sampled_from(
        ["2099-01-01T00:00:00+00:00", "2000-01-01T00:00:00+00:00", "2099-01-01T00:00:00", "x"]
    )
    return st.one_of(duration, iso, hostile_text())


#: Files of items for ``add --from-file``: good, bad in one line, empty, missing, not UTF-8.
ITEM_FILES = {
    "good.jsonl": '{"id": "n1", "payload": {"k": 1}}\n{"id": "n2"}\n',
    "good.csv": "id,amount\nn3,5\nn4,\n",
    "bad-late.jsonl": '{"id": "n5"}\n' * 50 + '{"id": "bad id"}\n',
    "bad.csv": "id,payload\nn6,{oops\n",
    "empty.txt": "\n",
    "latin1.csv": "id\ncaf\xe9\n",
}


def item_files() -> st.SearchStrategy[str]:
    """Paths of item files (written once per session under the temp dir), or odd paths."""
    folder = Path(tempfile.gettempdir()) / "rl-fuzz-cli-files"
    folder.mkdir(exist_ok=True)
    for name, text in ITEM_FILES.items():
        path = folder / name
        if not path.exists():
            path.write_bytes(text.encode("latin-1" if "latin1" in name else "utf-8"))
    names = [str(folder / name) for name in ITEM_FILES]
    return mostly(st.sampled_from(names), st.sampled_from(["-", "", str(folder / "none")]))


def payload_files() -> st.SearchStrategy[str]:
    """``@FILE`` payloads: a JSON file, a file that is not JSON, a missing one, ``@``."""
    folder = Path(tempfile.gettempdir()) / "rl-fuzz-cli-files"
    folder.mkdir(exist_ok=True)
    (folder / "payload.json").write_text('{"v": 1}')
    return st.sampled_from(
        [f"@{folder / 'payload.json'}", f"@{folder / 'good.csv'}", f"@{folder / 'none'}", "@"]
    )


@dataclass(frozen=True)
class Backend:
    """Where one fuzz test runs its commands."""

    url: str
    prefix: str
    client: redis.Redis
    embedded: bool

    def snapshot(self) -> dict[bytes, Any]:
        """DUMP of every key of the embedded server, or under the prefix on the shared one."""
        match = "*" if self.embedded else f"{self.prefix}*"
        return {k: self.client.dump(k) for k in self.client.scan_iter(match=match, count=1000)}

    def reset(self) -> None:
        """Deletes those keys."""
        keys = list(self.snapshot())
        for start in range(0, len(keys), 500):
            self.client.delete(*keys[start : start + 500])


@st.composite
def command_lines(draw: st.DrawFn, backend: Backend, lease_id: str) -> list[str]:
    """One command line: global options, a command, its positionals and options, extras."""
    run = mostly(st.just(RUN), valid_ids() | hostile_text())
    item = mostly(st.sampled_from(list("abcdef")), valid_ids() | hostile_text())
    jobs = [*BAD_JOBS, *([REAL_JOB] * 4 if backend.embedded else [])]
    job = mostly(st.sampled_from(jobs), hostile_text().map(lambda s: "nosuch_fz_mod." + s))
    token = number_args(["1", "2", "3"])
    lease = mostly(st.sampled_from([lease_id, ""]), valid_ids() | hostile_text())
    flag = st.just("")
    formats = st.sampled_from(["auto", "csv", "jsonl", "x"])
    states = mostly(st.sampled_from(["pending", "leased", "done", "dead"]), hostile_text())
    cursors = mostly(st.sampled_from(["0:0", "0:1", "1:0", "0:99999999999"]), hostile_text())
    commands: dict[str, tuple[list[Any], dict[str, Any], set[str]]] = {
        "add": ([run, item, item], {"--payload": json_args() | payload_files(),
                "--from-file": item_files(), "--format": formats,
                "--shards": number_args(["1", "2"]),
                "--max-attempts": number_args(["1", "3"]), "--json": flag}, set()),
        "claim": ([run, item], {"--worker": mostly(valid_ids(), hostile_text()),
                  "--ttl": number_args(["0.001", "60"]), "--json": flag}, {"--worker"}),
        "renew": ([run, item], {"--token": token, "--lease-id": lease, "--trace-id": lease,
                  "--ttl": number_args(["60"]), "--json": flag}, {"--token"}),
        "commit": ([run, item], {"--token": token, "--lease-id": lease, "--trace-id": lease,
                   "--result": json_args(), "--json": flag}, {"--token"}),
        "fail": ([run, item], {"--token": token, "--lease-id": lease, "--trace-id": lease,
                 "--error": mostly(st.text(min_size=1, max_size=20), hostile_text()),
                 "--permanent": flag, "--json": flag}, {"--token", "--error"}),
        "release": ([run, item], {"--token": token, "--lease-id": lease, "--trace-id": lease,
                    "--json": flag}, {"--token"}),
        "reap": ([run], {"--limit": number_args(["1", "10"]), "--json": flag}, set()),
        "requeue": ([run, item], {"--item": item, "--limit": number_args(["1", "10"]),
                    "--json": flag}, set()),
        "inspect": ([run, item], {"--attempts": number_args(["1", "20"]), "--json": flag}, set()),
        "resolve-effect": ([run, item, mostly(st.just("pay"), hostile_text())],
                           {"--applied": json_args() | payload_files(), "--not-applied": flag,
                            "--worker": mostly(valid_ids(), hostile_text()), "--json": flag},
                           set()),
        "items": ([run], {"--state": states, "--limit": number_args(["1", "2", "50"]),
                  "--cursor": cursors, "--json": flag}, set()),
        "dead": ([run], {"--limit": number_args(["1", "50"]), "--cursor": cursors,
                 "--json": flag}, set()),
        "runs": ([], {"--job": mostly(st.sampled_from(["fleet", "nightly"]), hostile_text()),
                 "--state": mostly(st.sampled_from(["running", "partial"]), hostile_text()),
                 "--since": mostly(st.sampled_from(DATES), hostile_text()),
                 "--limit": number_args(["1", "50"]), "--json": flag}, set()),
        "status": ([run], {"--json": flag}, set()),
        "resume": ([run], {"--deadline": deadlines()}, set()),
        "cancel": ([run], {}, set()),
        "tick": ([job], {"--json": flag}, set()),
        "start": ([job], {"--date": mostly(st.sampled_from(DATES), hostile_text()),
                  "--json": flag}, set()),
        "schedule install": ([job], {"--interval": number_args(["10", "60"])}, set()),
        "schedule show": ([job], {"--json": flag}, set()),
        "schedule remove": ([job], {}, set()),
        "metrics": ([], {"--max-runs": number_args(["1", "50"])}, set()),
    }  # fmt: skip
    name = draw(st.sampled_from(sorted(commands)), label="command")
    positionals, options, required = commands[name]
    # Optional positionals (claim's item, status's run, tick's jobs...) may be left out.
    count = draw(mostly(st.just(len(positionals)), st.integers(0, len(positionals))))
    args = [draw(strategy) for strategy in positionals[:count]]
    for option, values in options.items():
        if draw(st.integers(0, 9)) < (9 if option in required else 5):
            value = draw(values)
            args += [option] if value == "" and values is flag else [option, value]
    extras = st.one_of(
        st.text(string.ascii_letters + "-", min_size=1, max_size=8)
        .map(lambda s: "--" + s)
        .filter(lambda o: o not in ("--serve", "--burst")),
        st.sampled_from(["-", "--", "-x", "--help", "--url", "--prefix", "--json"]),
        hostile_text(),
    )
    if draw(st.integers(0, 4)) == 0:
        args.insert(draw(st.integers(0, len(args))), draw(extras))
    globals_ = ["--url", backend.url, "--prefix", backend.prefix]
    choice = draw(st.integers(0, 9))
    if choice == 0:  # a bad prefix or URL, or the version
        bad = st.sampled_from(["", "a b", "{x}", "x" * 300, *SURROGATES, "--version"])
        urls = st.sampled_from(
            ["", "nonsense", "redis://:99999", "redis://h:abc", "redis+sentinel://x",
             "redis://127.0.0.1:6379/x", "fakeredis://other-fz"]
        )  # fmt: skip
        globals_ = ["--url", draw(urls), "--prefix", backend.prefix] + (
            ["--prefix", draw(bad)] if draw(st.booleans()) else []
        )
    elif choice == 1:  # left out: the environment names this backend
        globals_ = []
    return [*globals_, *name.split(), *args]


def check_result(backend: Backend, args: list[str]) -> int:
    """Runs one command line and checks its output, exit code and writes; returns the code."""
    env = {**dict.fromkeys(ENV_NAMES), "REDIS_LEASE_URL": backend.url}
    env["REDIS_LEASE_PREFIX"] = backend.prefix
    before = backend.snapshot()
    result = runner.invoke(app, args, env=env)
    out, err, code = result.stdout, result.stderr, result.exit_code
    shown = f"exit {code}\nstdout: {out[-500:]!r}\nstderr: {err[-1000:]!r}"
    assert isinstance(result.exception, SystemExit | None), shown
    assert "Traceback" not in out + err, shown
    assert code in (0, 2, 3, 4, 5, 6, 7), f"undocumented or unexpected exit: {shown}"
    lines = [line for line in err.splitlines() if not line.startswith(("warning: ", "danger: "))]
    if code == 0:
        assert not any(line.startswith("error") for line in lines), shown
        if "--json" in args and not {"--help", "--version"} & set(args):
            json.loads(out)
    elif code == 2 and "Usage:" in err:
        pass  # typer's usage text (a command group called without its command)
    else:
        assert len(lines) == 1 and lines[0].startswith("error: "), shown
    if code == 2:
        assert backend.snapshot() == before, f"exit 2 wrote keys: {shown}"
    return code


def fuzz_cli(backend: Backend, data: st.DataObject) -> None:
    """One example: a fresh scene, one generated command line, the checks."""
    store = LeaseStore(backend.client, prefix=backend.prefix, url=backend.url)
    scene = FuzzScene(store)
    try:
        args = data.draw(command_lines(backend, scene.lease.lease_id), label="argv")
        event(f"exit {check_result(backend, args)}")
    finally:
        backend.reset()


@pytest.fixture
def embedded(prefix: str) -> Iterator[Backend]:
    """The CLI on an embedded server of this test's own (``fakeredis://<prefix>``)."""
    url = f"fakeredis://{prefix}"
    client = clients.client_from_url(url)
    names = set(clients._fake_servers)
    yield Backend(url, prefix, client, embedded=True)
    client.close()
    for name in set(clients._fake_servers) - names:
        clients._fake_servers.pop(name, None)
    clients._fake_servers.pop(prefix, None)


@pytest.fixture
def shared(redis_url: str, prefix: str) -> Iterator[Backend]:
    """The CLI on the shared Redis, under this test's prefix."""
    client = redis.Redis.from_url(redis_url)
    backend = Backend(redis_url, prefix, client, embedded=False)
    yield backend
    backend.reset()
    client.close()
    clients._fake_servers.pop("other-fz", None)


@fuzz_settings(100)
@given(data=st.data())
def test_generated_command_lines_on_fakeredis(embedded: Backend, data: st.DataObject) -> None:
    fuzz_cli(embedded, data)


@fuzz_settings(40)
@given(data=st.data())
def test_generated_command_lines_on_redis(shared: Backend, data: st.DataObject) -> None:
    fuzz_cli(shared, data)
