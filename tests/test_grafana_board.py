"""The Grafana board: it loads, has a ``job`` variable, and every query reads only
metrics the exporter serves for a real run; promtool parses every query."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from redis_lease import LeaseStore
from redis_lease.fleet.jobs.job import Job
from tests.exported_metrics import exercise, metric_names, sample_names
from tests.fleet_helpers import configure_nightly
from tests.helpers import scrape
from tests.test_alert_rules import run_promtool

BOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "redis-lease.json"
#: Grafana's variables, as a query would be sent once they are filled in.
FILLED = {"$job": ".*", "$__rate_interval": "5m", "$__range": "1d"}
#: What the board shows, by the words its panel titles must hold.
WANTED_PANELS = (
    "oldest eligible age",
    "throughput",
    "attempts per transition",
    "dead and lost",
    "deadline and projected finish",
    "quantiles",
    "failed shard jobs",
    "runs finished by state",
)


def board() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(BOARD.read_text())
    return loaded


def exprs() -> list[str]:
    return [target["expr"] for panel in board()["panels"] for target in panel["targets"]]


def variable_query() -> str:
    [job] = [v for v in board()["templating"]["list"] if v["name"] == "job"]
    query = job["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def test_the_board_loads_with_its_panels_and_job_variable() -> None:
    loaded = board()
    assert 36 <= loaded["schemaVersion"] <= 41
    titles = [panel["title"].lower() for panel in loaded["panels"]]
    for words in WANTED_PANELS:
        assert any(words in title for title in titles), (words, titles)
    assert len({panel["id"] for panel in loaded["panels"]}) == len(titles)
    assert re.fullmatch(r"label_values\(redis_lease_\w+, job\)", variable_query())
    for panel in loaded["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            if "redis_lease_redis_eviction_danger" not in target["expr"]:
                assert 'job=~"$job"' in target["expr"], target["expr"]  # follows the variable


def test_quantiles_come_from_the_histogram_buckets() -> None:
    quantiles = [e for e in exprs() if "histogram_quantile" in e]
    assert any("redis_lease_processing_duration_seconds_bucket" in e for e in quantiles)
    assert all(" le)" in e or "(le," in e or " le," in e for e in quantiles), quantiles


@pytest.fixture
def nightly(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Job]]:
    """The nightly job on an RQ queue of this test's own."""
    yield from configure_nightly(real_store, monkeypatch, items=6)


def test_every_query_reads_metrics_the_exporter_serves(
    real_store: LeaseStore, nightly: Callable[..., Job]
) -> None:
    exported = sample_names(exercise(real_store))
    metric, label = re.findall(r"\w+", variable_query())[1:3]
    assert any(name == metric and label in dict(labels) for name, labels in scrape(real_store))
    for expr in [*exprs(), variable_query()]:
        names = metric_names(expr)
        assert names, expr
        assert names <= exported, (expr, sorted(names - exported))


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    rules = ["groups:", "  - name: board", "    rules:"]
    for number, expr in enumerate(exprs()):
        for variable, value in FILLED.items():
            expr = expr.replace(variable, value)
        rules += [f"      - record: board:query_{number}", f"        expr: {json.dumps(expr)}"]
    path = tmp_path / "board_rules.yml"
    path.write_text("\n".join(rules) + "\n")
    done = run_promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
