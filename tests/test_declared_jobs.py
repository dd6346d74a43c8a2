"""The jobs workers declare (declare_jobs.lua) and what the tick leader says of the ones it
does not tick, as read for people: ``redis-lease workers``, the metrics. Whatever a worker
wrote is read as hostile data.

The leader that ticks declared jobs, or names them, is in tests/test_tick_leader.py; worker
processes in tests/test_tick_leader_fleet.py.
"""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from redis_lease import LeaseStore
from redis_lease.cli import app
from redis_lease.operate.dashboard import create_app
from redis_lease.operate.metrics.collector import LeaseCollector
from redis_lease.operate.output import iso_time
from redis_lease.operate.worker_views import worker_rows
from redis_lease.protocol.store.declared_jobs import (
    Unticked,
    declarations,
    declare_jobs,
    declared_jobs,
    is_job_path,
    read_unticked,
    unticked_text,
    withdraw_jobs,
)
from redis_lease.protocol.store.leader import (
    hold_leadership,
    process_holder,
    release_leadership,
    shown_holder,
)
from tests.helpers import server_ms, wait_past

NIGHTLY = {"nightly": "app.jobs:nightly"}
WEEKLY = {"weekly": "app.weekly:weekly"}


def unticked_by(store: LeaseStore) -> dict[str, tuple[bool, str]]:
    """Each declared job: whether it is ticked, and why not."""
    return {name: (job.ticked, job.reason) for name, job in declared_jobs(store).jobs.items()}


def test_a_process_holder_shows_its_name_and_two_of_one_name_differ() -> None:
    first, second = process_holder("w1"), process_holder("w1")
    assert first != second
    assert shown_holder(first) == shown_holder(second) == "w1"
    assert shown_holder("w1") == "w1", "a holder an earlier release wrote: its name alone"
    long = process_holder("x" * 400)
    assert len(long.encode()) <= 255 and shown_holder(long) == "x" * (255 - 33)


def test_declarations_are_kept_renewed_and_withdrawn(store: LeaseStore) -> None:
    declare_jobs(store, "w1#a", "w1", NIGHTLY)
    declare_jobs(store, "w2#b", "w2", {**NIGHTLY, **WEEKLY})
    found = {d.holder: (d.worker, d.jobs) for d in declarations(store)}
    assert found == {"w1#a": ("w1", NIGHTLY), "w2#b": ("w2", {**NIGHTLY, **WEEKLY})}
    fleet = declared_jobs(store)
    assert fleet.jobs["nightly"].workers == ["w1", "w2"]
    assert fleet.jobs["weekly"].workers == ["w2"]
    withdraw_jobs(store, "w2#b")
    assert [d.holder for d in declarations(store)] == ["w1#a"]
    for key in store.keys.tick_declared:
        assert 0 < store.client.pttl(key) <= 60_000, "the keys go once no worker declares"


def test_a_declaration_not_renewed_is_dropped(real_store: LeaseStore) -> None:
    """A worker gone two minutes: its declaration no longer counts, and the next declaration
    of any worker drops it."""
    store = real_store
    declared, seen = store.keys.tick_declared
    declare_jobs(store, "gone#a", "gone", WEEKLY)
    store.client.zadd(seen, {"gone#a": server_ms(store.client) - 120_000})
    assert declarations(store) == []
    dropped = store.scripts.call(
        "declare_jobs", [declared, seen], ["w1#a", '{"worker": "w1", "jobs": {}}', 60_000]
    )[1]
    assert dropped == 1
    assert store.client.hkeys(declared) == [b"w1#a"]
    assert store.client.zrange(seen, 0, -1) == [b"w1#a"]


def test_with_no_live_leader_every_declared_job_is_unticked(store: LeaseStore) -> None:
    assert declare_jobs(store, "w1#a", "w1", NIGHTLY) is None, "no leader says anything"
    assert unticked_by(store) == {
        "nightly": (False, "no worker holds the tick leader's lease"),
    }
    holder = process_holder("w1")
    hold_leadership(store, holder, 10_000)
    assert unticked_by(store) == {"nightly": (True, "")}
    release_leadership(store, holder)
    assert not unticked_by(store)["nightly"][0]


def test_what_the_leader_says_is_read_only_for_its_own_lease(store: LeaseStore) -> None:
    """The leader keeps its list beside its lease: a new holder starts with none, and a list
    of another holder or token (an earlier release's leader left it) is not taken."""
    declare_jobs(store, "w2#b", "w2", {**NIGHTLY, **WEEKLY})
    holder = process_holder("w1")
    lease = hold_leadership(store, holder, 10_000)
    said = [Unticked("weekly", WEEKLY["weekly"], ("w2",), "not loaded")]
    hold_leadership(store, holder, 10_000, unticked=unticked_text(holder, lease.token, said))
    fleet = declared_jobs(store)
    assert fleet.leader == "w1" and fleet.token == lease.token
    assert unticked_by(store) == {
        "nightly": (True, ""),
        "weekly": (False, "the tick leader w1: not loaded"),
    }
    assert [u.reason for u in declare_jobs(store, "w2#b", "w2", WEEKLY) or []] == [
        "the tick leader w1: not loaded"
    ]
    hold_leadership(store, holder, 10_000)  # '' keeps what it said
    assert not unticked_by(store)["weekly"][0]
    stale = unticked_text(holder, lease.token + 1, said)
    hold_leadership(store, holder, 10_000, unticked=stale)
    assert unticked_by(store)["weekly"] == (True, ""), "another token's list"
    release_leadership(store, holder)
    other = process_holder("w3")
    hold_leadership(store, other, 10_000)
    assert store.client.hget(store.keys.tick_leader, "unticked") is None
    assert unticked_by(store)["weekly"] == (True, "")


@pytest.mark.parametrize(
    "record",
    [
        "not json",
        "[1, 2]",
        '{"worker": "w9"}',
        '{"worker": "w9", "jobs": []}',
        '{"worker": "w9", "jobs": {"bad name{x}": "app.jobs:nightly"}}',
        '{"worker": "w9", "jobs": {"ok": "os.system:call; rm -rf /"}}',
        '{"worker": "w9", "jobs": {"ok": "../etc:passwd"}}',
        '{"worker": "w9", "jobs": {"ok": 42}}',
        "[" * 5000 + "]" * 5000,
        "\xff\xfe",
    ],
)
def test_a_hostile_declaration_is_skipped(real_store: LeaseStore, record: str) -> None:
    store = real_store
    declared, seen = store.keys.tick_declared
    declare_jobs(store, "w1#a", "w1", NIGHTLY)
    store.client.hset(declared, "w9#x", record.encode("latin-1", errors="replace"))
    store.client.zadd(seen, {"w9#x": int(store.client.time()[0]) * 1000})
    assert [d.holder for d in declarations(store)] == ["w1#a"]
    assert list(declared_jobs(store).jobs) == ["nightly"]
    assert [row.name for row in worker_rows(store)] == ["w1"]


def test_a_hostile_list_beside_the_lease_is_skipped(real_store: LeaseStore) -> None:
    holder = process_holder("w1")
    token = hold_leadership(real_store, holder, 10_000).token
    good = {"job": "weekly", "path": "app.weekly:weekly", "workers": ["w2"], "reason": "r"}
    for bad in (
        {**good, "job": "{x}"},
        {**good, "path": "app weekly"},
        {**good, "reason": 7},
        {**good, "workers": "w2"},
        "weekly",
    ):
        raw = json.dumps({"holder": holder, "token": token, "jobs": [bad, good]})
        found = read_unticked(raw, holder, token)
        assert found[-1] == Unticked("weekly", "app.weekly:weekly", ("w2",), "r")
        assert len(found) <= 2 and all(u.job == "weekly" for u in found)
    assert read_unticked("{", holder, token) == []
    assert read_unticked(json.dumps({"holder": holder, "token": str(token)}), holder, token) == []


def test_job_paths_are_python_names_only() -> None:
    assert is_job_path("app.jobs:nightly") and is_job_path("jobs:nightly")
    for bad in ("app.jobs", ":x", "app.:x", "app.jobs:", "a b:c", "a:b:c", "x" * 300, None, 1):
        assert not is_job_path(bad), bad


def test_workers_and_metrics_name_a_declared_job_no_leader_ticks(real_store: LeaseStore) -> None:
    store = real_store
    holder = process_holder("w1")
    declare_jobs(store, holder, "w1", NIGHTLY)
    declare_jobs(store, "w2#b", "w2", {**NIGHTLY, **WEEKLY})
    token = hold_leadership(store, holder, 10_000).token
    said = [Unticked("weekly", WEEKLY["weekly"], ("w2",), "its module is not loaded")]
    hold_leadership(store, holder, 10_000, unticked=unticked_text(holder, token, said))

    rows = {row.name: row for row in worker_rows(store)}
    assert rows["w1"].tick_leader and not rows["w2"].tick_leader
    assert rows["w2"].jobs == {**NIGHTLY, **WEEKLY}
    assert rows["w2"].unticked_jobs == [
        {
            "job": "weekly",
            "path": "app.weekly:weekly",
            "reason": "the tick leader w1: its module is not loaded",
        }
    ]
    assert rows["w1"].unticked_jobs == []

    registry = CollectorRegistry()
    registry.register(LeaseCollector(store))
    samples = {
        sample.labels["job"]: sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        if family.name == "redis_lease_declared_job_unticked"
        for sample in family.samples
    }
    assert samples == {"nightly": 0, "weekly": 1}

    args = ["--url", store.url, "--prefix", store.prefix, "workers"]
    shown = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    assert (
        "danger: job weekly (app.weekly:weekly), declared by worker w2, is not ticked: the tick "
        "leader w1: its module is not loaded"
    ) in shown.stdout
    assert "weekly (not ticked)" in shown.stdout
    assert f"tick leader (token {token}, since " in shown.stdout and "): nightly" in shown.stdout
    listed = CliRunner().invoke(app, [*args, "--json"])
    assert listed.exit_code == 0, listed.output
    by_name = {row["name"]: row for row in json.loads(listed.stdout)}
    assert by_name["w2"]["unticked_jobs"][0]["job"] == "weekly"
    assert by_name["w1"]["tick_leader"] is True


def test_long_lists_are_cut_to_what_the_scripts_take(real_store: LeaseStore) -> None:
    """A worker given many jobs, and a leader naming many, never get a declaration or a
    renewal refused: what they write is cut to fit."""
    store = real_store
    names = {f"job-{n:03}-{'x' * 150}": f"app.módulo_{'ä' * 60}_{n}:job_{n}" for n in range(300)}
    declare_jobs(store, "w1#a", "w1", names)
    (declaration,) = declarations(store)
    assert 0 < len(declaration.jobs) < 300 and set(declaration.jobs.items()) <= set(names.items())
    holder = process_holder("w1")
    token = hold_leadership(store, holder, 10_000).token
    said = [
        Unticked(name, path, tuple(f"worker-{'w' * 200}-{k}" for k in range(50)), "é" * 600)
        for name, path in names.items()
    ]
    text = unticked_text(holder, token, said)
    assert hold_leadership(store, holder, 10_000, unticked=text).held
    kept = read_unticked(store.client.hget(store.keys.tick_leader, "unticked"), holder, token)
    assert 0 < len(kept) < len(said) and all(len(u.workers) <= 10 for u in kept)


def leader_samples(store: LeaseStore) -> dict[str, dict[str, float]]:
    """The exporter's tick leader series: metric name -> worker -> value."""
    registry = CollectorRegistry()
    registry.register(LeaseCollector(store))
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        if family.name.startswith("redis_lease_tick_leader"):
            for sample in family.samples:
                found.setdefault(sample.name, {})[sample.labels["worker"]] = sample.value
    return found


def test_the_leader_its_token_and_since_when_are_shown_everywhere(real_store: LeaseStore) -> None:
    """``workers`` (table and JSON), the Workers page and the metrics name the tick leader
    with its token and since when; a renewal keeps the time, a new holder gets its own, and
    with no live lease nothing names a leader."""
    store = real_store
    first, second = process_holder("w1"), process_holder("w<2>")
    declare_jobs(store, first, "w1", NIGHTLY)
    declare_jobs(store, second, "w<2>", NIGHTLY)
    before = server_ms(store.client)
    # 3 s: the lease outlives the views below on a loaded machine; then it is waited out
    lease = hold_leadership(store, first, 3000)
    fleet = declared_jobs(store)
    assert (fleet.leader, fleet.token) == ("w1", lease.token)
    assert before <= fleet.since_ms <= lease.now_ms
    since = fleet.since_ms
    wait_past(store.client, since + 5)
    renewed = hold_leadership(store, first, 3000)
    assert declared_jobs(store).since_ms == since, "a renewal keeps when it began"

    rows = {row.name: row for row in worker_rows(store)}
    assert (rows["w1"].tick_leader_token, rows["w1"].tick_leader_since_ms) == (lease.token, since)
    assert rows["w<2>"].tick_leader_token is None and not rows["w<2>"].tick_leader
    args = ["--url", store.url, "--prefix", store.prefix, "workers"]
    shown = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    assert f"tick leader: w1, token {lease.token}, since {iso_time(since)}" in shown.stdout
    listed = CliRunner().invoke(app, [*args, "--json"])
    by_name = {row["name"]: row for row in json.loads(listed.stdout)}
    assert by_name["w1"]["tick_leader_token"] == lease.token
    assert by_name["w1"]["tick_leader_since_ms"] == since
    page = create_app(store).test_client().get("/workers").get_data(as_text=True)
    assert f"Tick leader: <strong>w1</strong>, token {lease.token}" in page
    assert "w&lt;2&gt;" in page and "w<2>" not in page  # a name is shown as text
    assert leader_samples(store) == {
        "redis_lease_tick_leader_token": {"w1": lease.token},
        "redis_lease_tick_leader_since_seconds": {"w1": since / 1000},
    }

    wait_past(store.client, renewed.expires_ms)  # the lease runs out: nobody leads
    assert declared_jobs(store).leader == ""
    assert leader_samples(store) == {}
    shown = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert "tick leader:" not in shown.stdout and "tick leader (" not in shown.stdout
    assert "Tick leader:" not in create_app(store).test_client().get("/workers").get_data(True)

    taken = hold_leadership(store, second, 10_000)
    fleet = declared_jobs(store)
    assert (fleet.leader, fleet.token) == ("w<2>", lease.token + 1) == ("w<2>", taken.token)
    assert fleet.since_ms > since
    assert leader_samples(store)["redis_lease_tick_leader_token"] == {"w<2>": taken.token}
    release_leadership(store, second)
    assert declared_jobs(store).since_ms == 0
