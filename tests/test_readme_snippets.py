"""The README's Python snippets run as written, and the names it uses import as it says.

Every fenced ``python`` block of README.md is executed against the real Redis
under this test's own key prefix (``LeaseStore.from_url`` is pointed there).
Names a snippet imports from ``app.billing`` stand for the reader's code; the
test provides them: an account list and providers that apply each key once and
answer lookups. A block that defines a job is then worked: its planner's
items (or a few of its own when it has none) are added and every shard is
worked in-process, and each item must end done with its effect applied once.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import sys
import threading
import types
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import pytest

import redis_lease
from redis_lease import Item, Job, LeaseStore, Runs
from redis_lease.fleet.runs import FINAL_STATES
from redis_lease.fleet.worker.lease_keeper import LeaseKeeper
from redis_lease.fleet.worker.shard_loop import work_shard

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
BUSINESS_DATE = date(2026, 12, 2)


def python_blocks() -> list[tuple[int, str]]:
    """(line number, code) of each fenced python block of the README."""
    return [(README.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(README)]


class Provider:
    """The reader's provider client: applies each key once, answers lookups by key."""

    def __init__(self) -> None:
        self.applied: dict[str, Any] = {}
        self.sent: Counter[str] = Counter()
        self.lock = threading.Lock()

    def apply(self, key: str, payload: Any) -> dict[str, str]:
        """Applies the effect under ``key`` (a repeated key gets the first answer)."""
        with self.lock:
            self.sent[key] += 1
            return self.applied.setdefault(key, {"id": f"ref_{len(self.applied) + 1}"})  # type: ignore[no-any-return]

    def lookup(self, key: str) -> Any:
        """What was applied under ``key``, or None."""
        return self.applied.get(key)

    def fetch(self, account: Any) -> dict[str, Any]:
        """A bank statement (the blocking read of the concurrency snippet)."""
        return {"account": account, "balance": 100}

    async def refund(self, key: str, payload: Any) -> dict[str, str]:
        """The async provider call."""
        await asyncio.sleep(0)
        return self.apply(key, payload)


@pytest.fixture
def app_code(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``app.billing``: the reader's code the snippets import."""
    billing = types.ModuleType("app.billing")
    billing.accounts_for = lambda business_date: [41, 42, 43, 44, 45]  # type: ignore[attr-defined]
    billing.provider = Provider()  # type: ignore[attr-defined]
    billing.bank = Provider()  # type: ignore[attr-defined]
    billing.api = Provider()  # type: ignore[attr-defined]
    app = types.ModuleType("app")
    app.billing = billing  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "app", app)
    monkeypatch.setitem(sys.modules, "app.billing", billing)
    return billing


@pytest.fixture
def claims_found(
    real_store: LeaseStore, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Points ``LeaseStore.from_url`` at this test's prefix; returns what each
    ``claim_next`` a snippet calls finds (a snippet that claims nothing is wrong)."""
    original_from_url = LeaseStore.from_url.__func__  # type: ignore[attr-defined]
    original_claim_next = LeaseStore.claim_next
    found: list[int] = []

    def from_url(cls: type[LeaseStore], url: str, prefix: str = "", **options: Any) -> LeaseStore:
        assert url.startswith(("redis://", "rediss://", "fakeredis://")), url
        return original_from_url(cls, redis_url, prefix=real_store.prefix, **options)  # type: ignore[no-any-return]

    def claim_next(self: LeaseStore, *args: Any, **kwargs: Any) -> Any:
        leases = original_claim_next(self, *args, **kwargs)
        found.append(len(leases))
        return leases

    monkeypatch.setattr(LeaseStore, "from_url", classmethod(from_url))
    monkeypatch.setattr(LeaseStore, "claim_next", claim_next)
    return found


def work_job(store: LeaseStore, job: Job) -> tuple[str, list[Item]]:
    """Adds the job's items for the business date and works every shard in-process."""
    planned = list(job.plan_items(BUSINESS_DATE)) if job.plan_items else []
    items = planned or [Item(f"acct_{n}:cursor_1", {"account": n}) for n in range(5)]
    run_id = job.run_id(BUSINESS_DATE)
    store.add(run_id, items, shards=job.options.shards)
    keeper = LeaseKeeper(
        store, job.options.lease_ttl_seconds
    )  # not started: no lease needs renewing
    for shard in range(job.options.shards):
        stop = threading.Event()
        work_shard(store, job, run_id, shard, worker="w1", budget=30, stop=stop, keeper=keeper)
    return run_id, items


@pytest.mark.parametrize(("line", "code"), python_blocks(), ids=lambda v: str(v)[:12])
def test_every_python_snippet_of_the_readme_runs(
    line: int,
    code: str,
    real_store: LeaseStore,
    claims_found: list[int],
    app_code: types.ModuleType,
) -> None:
    namespace: dict[str, Any] = {"__name__": f"readme_line_{line}"}
    exec(compile(code, f"README.md:{line}", "exec"), namespace)

    assert all(claims_found), f"a claim_next of the snippet at line {line} found nothing"
    store, run = namespace.get("store"), namespace.get("run")
    if isinstance(store, LeaseStore) and isinstance(run, str):
        status = store.status(run)
        assert status.counts["done"] == status.total > 0, "the snippet leaves items unfinished"
        info = Runs(store).info(run)
        assert info["state"] in FINAL_STATES, f"the snippet leaves run {run!r} {info['state']}"
        assert info["state"] == "succeeded", info

    jobs = [v for v in namespace.values() if isinstance(v, Job) and v.handle_item is not None]
    providers = [app_code.provider, app_code.bank, app_code.api]
    for job in jobs:
        sent_before = sum(sum(p.sent.values()) for p in providers)
        run_id, items = work_job(real_store, job)
        status = real_store.status(run_id)
        assert status.counts["done"] == len(items), (job.name, status.counts)
        assert all(n == 1 for p in providers for n in p.sent.values()), "an effect sent twice"
        assert sum(sum(p.sent.values()) for p in providers) - sent_before == len(items)
        for item in items:
            record = real_store.item(run_id, item.id)
            assert isinstance(record.result, dict) and set(record.result) == {"reference"}


def test_the_readme_has_the_snippets_this_test_runs() -> None:
    codes = [code for _, code in python_blocks()]
    assert len(codes) >= 3
    assert any("claim_next" in code for code in codes)
    assert sum("@" in code and ".handler" in code for code in codes) >= 2


def resolve(dotted: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(dotted)


def dotted_paths() -> list[str]:
    """Every ``redis_lease.x.y`` the README names (in code spans and blocks)."""
    return sorted(set(re.findall(r"\bredis_lease(?:\.[A-Za-z_]\w*)+", README)))


@pytest.mark.parametrize("dotted", dotted_paths())
def test_every_import_path_in_the_readme_resolves(dotted: str) -> None:
    assert resolve(dotted) is not None


def public_classes() -> dict[str, str]:
    """Classes of the library's public modules, by name: the module that defines each."""
    modules = [
        "errors",
        "fleet.gate",
        "protocol.guards",
        "fleet.job",
        "fleet.live_lease",
        "protocol.values",
        "fleet.runs",
        "fleet.worker.lease_keeper",
        "fleet.worker.settlements",
        "protocol.store.lease_store",
    ]
    found: dict[str, str] = {}
    for name in modules:
        module = importlib.import_module(f"redis_lease.{name}")
        for attr, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == module.__name__:
                found.setdefault(attr, module.__name__)
    return found


def names_in_code_spans() -> set[str]:
    """CamelCase names in the README's inline code spans and python blocks."""
    spans = re.findall(r"`([^`\n]+)`", BLOCK.sub("", README))
    text = " ".join(spans + [code for _, code in python_blocks()])
    return set(re.findall(r"\b[A-Z][a-z]+[A-Za-z]*\b", text))


def test_every_library_class_the_readme_names_imports_from_redis_lease() -> None:
    classes = public_classes()
    named = {name for name in names_in_code_spans() if name in classes}
    assert {"EffectFailed", "Throttled", "ProviderGate", "Job", "HandlerResult"} <= named
    missing = {name: classes[name] for name in sorted(named) if name not in redis_lease.__all__}
    assert missing == {}, "named in the README but not importable from redis_lease"


def test_the_readme_says_what_make_test_installs_and_how_to_run_without() -> None:
    """Every package an ensure script installs or fetches is named next to ``make test``."""
    scripts = "".join(path.read_text() for path in (ROOT / "scripts").glob("ensure-*.sh"))
    packages = set(re.findall(r"apt-get (?:install|download) [^\n]*?(\S+) >/dev/null", scripts))
    assert packages == {"redis-server", "faketime", "chromium", "prometheus"}
    paragraph = next(p for p in README.split("\n\n") if p.startswith("`make test` may install"))
    for package in packages:
        assert f"`{package}`" in paragraph, package
    assert "CI=true" in paragraph and ".venv/bin/pytest" in paragraph
