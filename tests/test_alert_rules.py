"""The Prometheus alert rules: promtool checks them and runs their unit tests (each rule
fires on some series and stays quiet on others), and every metric they read is one the
exporter serves for a real run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from redis_lease import LeaseStore
from redis_lease.fleet.jobs.job import Job
from tests.exported_metrics import exercise, metric_names, sample_names
from tests.fleet_helpers import configure_nightly

ROOT = Path(__file__).resolve().parent.parent
RULES_DIR = ROOT / "deploy" / "prometheus"
#: Where scripts/ensure-promtool.sh puts promtool when it is not on PATH.
CACHED_PROMTOOL = ROOT / ".cache" / "promtool" / "usr" / "bin" / "promtool"
RULES = RULES_DIR / "alerts.yml"
RULE_TESTS = RULES_DIR / "alerts_test.yml"
#: ``expr: |`` and the lines indented under it, or ``expr: <one line>``.
_EXPR = re.compile(r"^(\s*)expr: ?(\|?)(.*)$")


def promtool() -> str:
    """promtool's path (on PATH, else in the project's cache); fails under CI=true when it
    is missing, else skips."""
    found = shutil.which("promtool")
    if found:
        return found
    if os.access(CACHED_PROMTOOL, os.X_OK):
        return str(CACHED_PROMTOOL)
    message = "promtool is missing: scripts/ensure-promtool.sh fetches it into .cache/promtool"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, cwd=RULES_DIR
    )


def expressions(text: str) -> list[str]:
    """The ``expr`` of every rule in a rules file."""
    lines = text.splitlines()
    found = []
    for number, line in enumerate(lines):
        match = _EXPR.match(line)
        if not match:
            continue
        indent, block, rest = match.groups()
        if not block:
            found.append(rest.strip())
            continue
        body = []
        for following in lines[number + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= len(indent):
                break
            body.append(following)
        found.append("\n".join(body).strip())
    return found


def alert_names(text: str) -> list[str]:
    return re.findall(r"^\s*- alert: (\S+)$", text, flags=re.MULTILINE)


def test_promtool_is_found_in_the_project_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = tmp_path / "cache" / "promtool"
    cached.parent.mkdir()
    cached.write_text("#!/bin/sh\n")
    cached.chmod(0o755)
    monkeypatch.setattr(sys.modules[__name__], "CACHED_PROMTOOL", cached)
    monkeypatch.setenv("PATH", str(tmp_path))  # no promtool on PATH
    assert promtool() == str(cached)


def test_promtool_checks_the_rules() -> None:
    done = run_promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_names(RULES.read_text()))} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = run_promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_rule_has_a_case_that_fires_and_one_that_does_not() -> None:
    tests = RULE_TESTS.read_text()
    for alert in alert_names(RULES.read_text()):
        cases = re.findall(
            rf"alertname: {alert}\n\s*exp_alerts:(.*?)(?=\n\s*- eval_time:|\n- name:|\Z)",
            tests,
            flags=re.DOTALL,
        )
        fires = [case for case in cases if "exp_labels" in case]
        quiet = [case for case in cases if case.strip().startswith("[]")]
        assert fires and quiet, f"{alert}: {len(fires)} firing and {len(quiet)} quiet cases"


def test_every_rule_has_a_runbook_hint() -> None:
    text = RULES.read_text()
    blocks = re.split(r"^\s*- alert: ", text, flags=re.MULTILINE)[1:]
    assert len(blocks) == len(alert_names(text)) >= 10
    for block in blocks:
        assert "summary:" in block and "description:" in block, block
        assert "Runbook:" in block and "`redis-lease " in block, block  # the command to run


def test_the_expression_parser_finds_the_names() -> None:
    expr = (
        'max by (job, run) (redis_lease_items{state="pending"}) > 0 and on (job, run) '
        "sum(rate(redis_lease_claims_total[5m])) > bool 1e3 unless histogram_quantile(0.9, "
        'sum by (le) (rate(x_bucket{job=~"$job"}[$__rate_interval])))'
    )
    assert metric_names(expr) == {"redis_lease_items", "redis_lease_claims_total", "x_bucket"}


@pytest.fixture
def nightly(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Job]]:
    """The nightly job on an RQ queue of this test's own."""
    yield from configure_nightly(real_store, monkeypatch, items=6)


def test_every_metric_the_rules_read_is_exported(
    real_store: LeaseStore, nightly: Callable[..., Job]
) -> None:
    exported = sample_names(exercise(real_store))
    exprs = expressions(RULES.read_text())
    assert len(exprs) == len(alert_names(RULES.read_text()))
    used = set().union(*(metric_names(expr) for expr in exprs))
    assert len(used) >= 10
    assert used <= exported, sorted(used - exported)
