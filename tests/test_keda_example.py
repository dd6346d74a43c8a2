"""The KEDA example (examples/keda): its YAML parses, its pieces point at each other, and
its query selects the series the exporter serves once the tick has published it.

The YAML is read with a small parser for the block subset the example keeps to
(mappings, sequences, plain and quoted scalars, comments, ``---``); where a
system PyYAML exists, it must read the files the same way.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pytest

from redis_lease import Item, LeaseStore
from redis_lease.fleet.capacity.run_capacity import record_pass
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.scheduler_tick import tick_job
from redis_lease.fleet.worker.shard_job import ActiveLease
from redis_lease.operate.metrics.collector import WORKERS_NEEDED
from tests.fleet_helpers import purge_queue
from tests.helpers import scrape

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "keda"
_KEY = re.compile(r"^([A-Za-z_][\w.-]*):(?:\s+(.*))?$")
_QUERY = re.compile(r'^max\((\w+)\{(\w+)="([^"]+)"\}\)$')


# -- a parser for the block subset of YAML -------------------------------------


def _lines(text: str) -> list[tuple[int, str]]:
    """(indent, content) of the meaningful lines: no blanks, no comments."""
    out = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        assert "\t" not in raw, f"tab in YAML line {raw!r}"
        out.append((len(raw) - len(raw.lstrip(" ")), stripped))
    return out


def _scalar(text: str) -> Any:
    if text.startswith('"'):
        return json.loads(text)
    if text.startswith("'"):
        assert text.endswith("'"), text
        return text[1:-1].replace("''", "'")
    assert not text.startswith(("[", "{", "|", ">", "&", "*", "!")), f"outside the subset: {text}"
    if text in ("true", "false"):
        return text == "true"
    if text in ("null", "~"):
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


def _block(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    if lines[i][1] == "-" or lines[i][1].startswith("- "):
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _nested(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    """The block under a key or dash at ``indent``: deeper lines, or None."""
    if i < len(lines) and lines[i][0] > indent:
        return _block(lines, i, lines[i][0])
    return None, i


def _mapping(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith("-"):
        match = _KEY.match(lines[i][1])
        assert match, f"not a key: {lines[i][1]!r}"
        key, rest = match.group(1), match.group(2)
        assert key not in out, f"duplicate key {key}"
        if rest:
            out[key], i = _scalar(rest), i + 1
        else:
            out[key], i = _nested(lines, i + 1, indent)
    return out, i


def _sequence(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    while (
        i < len(lines)
        and lines[i][0] == indent
        and (lines[i][1] == "-" or lines[i][1].startswith("- "))
    ):
        item = lines[i][1][2:].strip()
        if not item:
            value, i = _nested(lines, i + 1, indent)
        elif _KEY.match(item):  # "- key: value" opens a mapping two columns in
            lines = [*lines[:i], (indent + 2, item), *lines[i + 1 :]]
            value, i = _mapping(lines, i, indent + 2)
        else:
            value, i = _scalar(item), i + 1
        out.append(value)
    return out, i


def load_all(text: str) -> list[Any]:
    """Every document of a YAML text in the block subset."""
    docs = []
    for part in re.split(r"^---\s*$", text, flags=re.MULTILINE):
        lines = _lines(part)
        if lines:
            value, end = _block(lines, 0, lines[0][0])
            assert end == len(lines), f"unparsed from {lines[end]}"
            docs.append(value)
    return docs


def test_the_subset_parser_reads_what_it_claims() -> None:
    text = 'a: 1\nb:\n  - x: "9"\n    y: true\n  - plain:colon\nc:\n  d: # note\n    - 0.0.0.0\n'
    text = text.replace(" # note", "")
    assert load_all(text + "---\ne: f\n") == [
        {"a": 1, "b": [{"x": "9", "y": True}, "plain:colon"], "c": {"d": ["0.0.0.0"]}},
        {"e": "f"},
    ]
    with pytest.raises(AssertionError, match="outside the subset"):
        load_all("a: [1, 2]\n")


# -- the example's files --------------------------------------------------------


def documents() -> dict[tuple[str, str], dict[str, Any]]:
    """The example's Kubernetes objects by (kind, name)."""
    found = {}
    for path in sorted(EXAMPLE.glob("*.yaml")):
        if path.name == "prometheus.yaml":
            continue
        for doc in load_all(path.read_text()):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def test_the_pieces_point_at_each_other() -> None:
    docs = documents()
    exporter = docs[("Deployment", "redis-lease-exporter")]
    service = docs[("Service", "redis-lease-exporter")]
    worker = docs[("Deployment", "redis-lease-worker")]
    scaled = docs[("ScaledObject", "payment-reconciliation-workers")]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"

    container = exporter["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[:2] == ["redis-lease", "metrics"]
    port = int(command[command.index("--serve") + 1])
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert container["ports"] == [{"name": "metrics", "containerPort": port}]
    assert service["spec"]["selector"] == exporter["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics"}]

    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    worker_command = worker["spec"]["template"]["spec"]["containers"][0]["command"]
    assert worker_command[:2] == ["redis-lease", "worker"]
    assert scaled["spec"]["minReplicaCount"] >= 1  # an unknown need still gets a worker

    (scrape_job,) = load_all((EXAMPLE / "prometheus.yaml").read_text())[0]["scrape_configs"]
    assert scrape_job["honor_labels"] is True  # keeps the exporter's `job` label
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    targets = scrape_job["static_configs"][0]["targets"]
    assert targets == [f"{name}.{namespace}.svc:{port}"]


def test_the_files_are_yaml_as_a_full_parser_reads_them() -> None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    probe = [python, "-c", "import yaml"] if python else None
    if probe is None or subprocess.run(probe, capture_output=True).returncode != 0:
        pytest.skip("no system python3 with PyYAML to compare against")
    assert python is not None
    paths = sorted(str(p) for p in EXAMPLE.glob("*.yaml"))
    script = (
        "import json, sys, yaml\n"
        "print(json.dumps([list(yaml.safe_load_all(open(p))) for p in sys.argv[1:]]))"
    )
    done = subprocess.run([python, "-c", script, *paths], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [load_all(Path(p).read_text()) for p in paths]


# -- the query against the exporter ---------------------------------------------

payment = Job(
    "payment-reconciliation",
    shards=2,
    schedule="0 2 * * *",
    timezone="UTC",
    deadline_after=timedelta(hours=6),
    catch_up="latest",
)


@payment.planner
def _plan(business_date: date) -> Iterator[Item]:
    for n in range(30):
        yield Item(f"acct-{n:03d}", {"n": n})


@payment.handler
def _handle(item: Item, lease: ActiveLease) -> dict[str, Any]:
    return {"n": item.payload}


@pytest.fixture
def payment_job(real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Job]:
    """The example's job on a queue of this test's own."""
    from dataclasses import replace

    name = f"{real_store.prefix}-keda"
    monkeypatch.setattr(payment, "options", replace(payment.options, queue=name))
    yield payment
    purge_queue(real_store.client, name)


def test_the_query_selects_the_series_the_exporter_serves(
    real_store: LeaseStore, payment_job: Job
) -> None:
    scaled = documents()[("ScaledObject", "payment-reconciliation-workers")]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"]["threshold"] == "1"
    match = _QUERY.match(trigger["metadata"]["query"])
    assert match, trigger["metadata"]["query"]
    metric, label, value = match.groups()
    assert (metric, label, value) == (WORKERS_NEEDED, "job", payment_job.name)

    def selected() -> list[float]:
        return [
            v
            for (name, labels), v in scrape(real_store).items()
            if (name, labels) == (metric, ((label, value),))
        ]

    start = datetime.combine(datetime.now(UTC).date() + timedelta(days=1), time(2, 0, 30), UTC)
    runs = Runs(real_store)
    path = "tests.test_keda_example:payment"
    tick_job(real_store, runs, path, payment_job, start)
    (run_id,) = runs.open_runs(payment_job.name)
    assert selected() == []  # unknown before any worker pass: no number to scale on
    record_pass(real_store, run_id, handled=10, handler_seconds=10.0, busy_seconds=1000.0)
    tick_job(real_store, runs, path, payment_job, start + timedelta(hours=5, seconds=-30))
    # 30 items at 0.01/s per worker with 3,600 s left: ceil(30 / 36) = 1 worker.
    assert selected() == [1]
    tick_job(real_store, runs, path, payment_job, start + timedelta(hours=5, minutes=59))
    # 30 s left (the deadline is 08:00, the clock 07:59:30): ceil(30 / (0.01 x 30)) = 100.
    assert selected() == [100]
