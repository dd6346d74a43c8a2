"""The protocol stamp and the release numbers.

The protocol the data under a prefix is in is stamped in Redis (``<prefix>:protocol``) by
the first worker, Python or Node.js; every command, worker and Node client reads it at
start and refuses, with one line naming both sides and exit 9, a protocol it does not
speak, having written nothing. Releases are numbered by the CHANGELOG's headings, each
naming its commit and date; the package, the CLI and the Node client carry the newest.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import tomllib
from typing import Any

import pytest

import redis_lease
from redis_lease import LeaseStore, ProtocolMismatch, check_protocol
from redis_lease.protocol.leases import Item
from redis_lease.protocol.store.stamp import PROTOCOL, SPOKEN, read_stamp
from tests.effect_jobs import delete_rq_queue
from tests.helpers import snapshot
from tests.releases import ROOT, Heading, headings, previous
from tests.test_cli import Cli, assert_error
from tests.test_cli import cli as cli  # the fixture: the CLI on real Redis and fakeredis
from tests.test_node_client import NODE_DIR
from tests.test_node_client import node as node  # the fixture: node, its packages installed

#: A protocol no release speaks.
ALIEN = "99"


def git(*args: str) -> str:
    """A git command's output in this checkout; fails the test when git fails."""
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr.strip()}"
    return done.stdout.strip()


# -- release numbers ------------------------------------------------------------------------


def test_the_package_the_cli_and_the_node_client_carry_the_newest_release() -> None:
    newest = headings()[0].version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    package = json.loads((NODE_DIR / "package.json").read_text())
    lock = json.loads((NODE_DIR / "package-lock.json").read_text())
    assert project["version"] == newest
    assert redis_lease.__version__ == newest
    assert package["version"] == lock["version"] == lock["packages"][""]["version"] == newest
    shown = subprocess.run(
        [sys.executable, "-m", "redis_lease", "--version"], capture_output=True, text=True
    )
    assert shown.stdout.strip() == f"redis-lease {newest}"


def test_every_release_but_the_one_under_way_names_its_date_and_commit() -> None:
    found = headings()
    numbers = [heading.number for heading in found]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)
    released = [heading for heading in found if heading.commit]
    assert released == found[1:] or released == found, "only the newest may be under way"
    for heading in released:
        assert heading.commit is not None
        assert git("cat-file", "-t", heading.commit) == "commit", heading
        assert git("show", "-s", "--format=%ad", "--date=short", heading.commit) == heading.date
    for newer, older in itertools.pairwise([heading.commit for heading in released]):
        git("merge-base", "--is-ancestor", str(older), str(newer))  # landed in this order
    git("merge-base", "--is-ancestor", str(released[0].commit), "HEAD")
    assert previous() == released[0]


def test_a_heading_of_another_form_fails_the_tests_that_read_them() -> None:
    with pytest.raises(pytest.fail.Exception, match=re.escape("'## 0.3.0 (unreleased)' is not")):
        headings("# Changelog\n\n## 0.3.0 (unreleased)\n")
    parsed = headings("## 0.3.0 - unreleased\n## 0.2.0 - 2026-01-02 (commit 0123abc)\n")
    assert parsed == [Heading("0.3.0", None, None), Heading("0.2.0", "2026-01-02", "0123abc")]


def test_the_docs_name_this_release_and_its_protocol() -> None:
    protocol_doc = (ROOT / "docs" / "protocol.md").read_text()
    assert f"This page is protocol {PROTOCOL}." in protocol_doc
    upgrading = (ROOT / "docs" / "upgrading.md").read_text()
    assert f"| {redis_lease.__version__} | {PROTOCOL} |" in upgrading
    assert f"| {previous().version} |" in upgrading  # the step the mixed test checks


# -- the stamp ------------------------------------------------------------------------------


def test_the_first_check_stamps_the_protocol_and_later_ones_read_it(store: LeaseStore) -> None:
    assert check_protocol(store, stamp=False) is None
    assert read_stamp(store) is None  # a check that only reads writes nothing
    assert check_protocol(store) == PROTOCOL
    assert read_stamp(store) == str(PROTOCOL)
    assert check_protocol(store, stamp=False) == check_protocol(store) == PROTOCOL


@pytest.mark.parametrize(
    ("stamp", "words"),
    [
        (
            ALIEN,
            [f"is in protocol {ALIEN}", "speaks protocol 1", "release that speaks protocol 99"],
        ),
        ("0", ["is in protocol 0", "speaks protocol 1"]),
        ("two", ["holds 'two', not a protocol number"]),
        ("\u0661", ["not a protocol number"]),  # ARABIC-INDIC DIGIT ONE: no ASCII digit
        ("9" * 500, ["not a protocol number", "..."]),
    ],
    ids=["alien", "zero", "word", "arabic-digit", "long"],
)
def test_a_stamp_this_release_does_not_speak_is_refused_and_kept(
    store: LeaseStore, stamp: str, words: list[str]
) -> None:
    store.client.set(store.keys.protocol, stamp)
    for writes in (True, False):
        with pytest.raises(ProtocolMismatch) as refused:
            check_protocol(store, stamp=writes)
        error = refused.value
        assert (error.found, error.speaks, error.exit_code) == (stamp, tuple(SPOKEN), 9)
        assert f"redis-lease {redis_lease.__version__}" in error.message
        assert error.message.endswith("nothing was written") and len(error.message) < 400
        for word in words:
            assert word in error.message, error.message
    assert read_stamp(store) == stamp


# -- the command line -----------------------------------------------------------------------


def test_commands_read_the_stamp_and_do_not_write_it(cli: Cli) -> None:
    shown = cli.ok("protocol")
    assert shown == {
        "prefix": cli.prefix,
        "stamped": None,
        "speaks": sorted(SPOKEN),
        "stamps": PROTOCOL,
        "release": redis_lease.__version__,
    }
    assert cli.keys() == []
    cli.ok("add", "r", "a")
    assert cli.client.get(f"{cli.prefix}:protocol") is None
    cli.client.set(f"{cli.prefix}:protocol", str(PROTOCOL))
    assert cli.ok("protocol")["stamped"] == PROTOCOL
    plain = cli("protocol")
    assert plain.exit_code == 0 and f"stamped\t{PROTOCOL}" in plain.stdout, plain.output


@pytest.mark.parametrize(
    "args",
    [
        ("add", "r", "b"),
        ("claim", "r", "a", "-w", "w1"),
        ("requeue", "r"),
        ("status", "r"),
        ("protocol",),
    ],
    ids=lambda args: args[0],
)
def test_every_command_refuses_an_alien_stamp_with_exit_9_and_writes_nothing(
    cli: Cli, args: tuple[str, ...]
) -> None:
    cli.ok("add", "r", "a")
    cli.client.set(f"{cli.prefix}:protocol", ALIEN)
    before = cli.snapshot()
    release = f"redis-lease {redis_lease.__version__} speaks protocol 1"
    assert_error(cli(*args), 9, f"is in protocol {ALIEN}", release)
    assert cli.snapshot() == before


def worker_command(url: str, prefix: str, queue: str) -> list[str]:
    """``redis-lease worker --burst`` of this release, as an operator starts it."""
    options = ["--url", url, "--prefix", prefix]
    return [sys.executable, "-m", "redis_lease", *options, "worker", "--burst", "--queue", queue]


def test_a_worker_refuses_an_alien_stamp_at_start_and_touches_nothing(
    redis_url: str, real_store: LeaseStore
) -> None:
    store, queue, name = real_store, f"{real_store.prefix}-q", f"{real_store.prefix}-w"
    store.add("r", [Item("a"), Item("b")], shards=2)
    store.client.set(store.keys.protocol, ALIEN)
    before = snapshot(store.client, store.prefix)
    try:
        done = subprocess.run(
            [*worker_command(redis_url, store.prefix, queue), "--name", name],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert done.returncode == 9, done
        assert done.stdout == "" and "Traceback" not in done.stderr, done
        (line,) = done.stderr.splitlines()
        assert line.startswith("error: the data under prefix ") and "protocol 99" in line, line
        assert f"redis-lease {redis_lease.__version__} speaks protocol 1" in line, line
        assert snapshot(store.client, store.prefix) == before
        rq = store.rq
        assert not rq.exists(f"rq:worker:{name}", f"rq:workers:{queue}", f"rq:queue:{queue}")
    finally:
        delete_rq_queue(store.rq, queue)


def test_a_worker_stamps_the_protocol_where_none_is(redis_url: str, real_store: LeaseStore) -> None:
    queue = f"{real_store.prefix}-q"
    try:
        done = subprocess.run(
            worker_command(redis_url, real_store.prefix, queue),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert done.returncode == 0, done
        assert read_stamp(real_store) == str(PROTOCOL)
    finally:
        delete_rq_queue(real_store.rq, queue)


# -- the Node.js client ---------------------------------------------------------------------


def run_node(node: str, program: str) -> Any:
    """What a Node.js module program run in the client's folder prints, as JSON."""
    done = subprocess.run(
        [node, "--input-type=module", "-e", program],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_node_client_speaks_what_the_python_one_speaks(node: str) -> None:
    program = "import * as m from './index.js';"
    program += "console.log(JSON.stringify([m.PROTOCOL, m.PROTOCOLS, m.VERSION]));"
    assert run_node(node, program) == [PROTOCOL, sorted(SPOKEN), redis_lease.__version__]


def node_worker(node: str, url: str, prefix: str) -> subprocess.CompletedProcess[str]:
    """``worker.js`` on run ``r`` until it ends."""
    command = [node, str(NODE_DIR / "worker.js"), "--url", url, "--prefix", prefix]
    command += ["--run", "r", "--timeout-s", "60"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_node_worker_refuses_an_alien_stamp_with_exit_9_and_touches_nothing(
    node: str, redis_url: str, real_store: LeaseStore
) -> None:
    store = real_store
    store.add("r", [Item("a"), Item("b")], shards=2)
    store.client.set(store.keys.protocol, ALIEN)
    before = snapshot(store.client, store.prefix)
    done = node_worker(node, redis_url, store.prefix)
    assert done.returncode == 9, done
    assert done.stdout == "", done
    (line,) = done.stderr.splitlines()
    assert line.startswith("worker.js: the data under prefix ") and "protocol 99" in line, line
    assert f"redis-lease-client {redis_lease.__version__} speaks protocol 1" in line, line
    assert snapshot(store.client, store.prefix) == before
    assert store.status("r").counts == {"pending": 2, "leased": 0, "done": 0, "dead": 0}


def test_the_node_worker_stamps_the_protocol_and_works_the_run(
    node: str, redis_url: str, real_store: LeaseStore
) -> None:
    real_store.add("r", [Item("a"), Item("b")], shards=2)
    done = node_worker(node, redis_url, real_store.prefix)
    assert done.returncode == 0, done
    assert read_stamp(real_store) == str(PROTOCOL)
    assert json.loads(done.stdout.splitlines()[-1])["committed"] == 2


def test_a_node_call_is_refused_by_a_stamp_that_holds_no_number(
    node: str, redis_url: str, real_store: LeaseStore
) -> None:
    real_store.add("r", [Item("a")])
    real_store.client.set(real_store.keys.protocol, "two")
    program = (
        "import {connect} from './index.js';"
        f"const c = connect({json.dumps(redis_url)}, {{prefix: {json.dumps(real_store.prefix)}}});"
        "const r = await c.claim('r', 'a').catch((e) => e);"
        "console.log(JSON.stringify([r.name, r.found, r.speaks])); await c.close();"
    )
    assert run_node(node, program) == ["ProtocolMismatch", "two", sorted(SPOKEN)]
    assert real_store.item("r", "a").state == "pending"
