"""Optional features: a missing extra is one line naming it, and the command line's
imports stay light (no web stack, metrics or embedded backend on a command's path)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import redis_lease
from redis_lease import MissingExtra, RedisLeaseError
from redis_lease.extras import EXTRAS, optional_import, require

#: Blocks the given packages in a child process (an import of them raises ImportError),
#: then runs the command line with the given arguments.
_CHILD = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None
sys.argv = ["redis-lease", *{args!r}]
from redis_lease.cli import main
main()
"""


def run_without(blocked: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``redis-lease ARGS`` in a child process in which ``blocked`` cannot be imported."""
    code = _CHILD.format(blocked=blocked, args=list(args))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_missing_extra_is_an_error_with_its_own_exit_code() -> None:
    error = MissingExtra("x", extra="dashboard")
    assert isinstance(error, RedisLeaseError)
    assert isinstance(error, ImportError)
    assert error.exit_code == 10
    assert error.extra == "dashboard"
    assert redis_lease.MissingExtra is MissingExtra


def test_an_installed_package_is_returned() -> None:
    assert optional_import("json", "demo", "the test") is sys.modules["json"]


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flask", None)
    with pytest.raises(MissingExtra) as raised:
        require("dashboard", "the dashboard")
    assert str(raised.value) == (
        "the dashboard needs the extra 'dashboard': pip install 'redis-lease[dashboard]'"
    )
    assert raised.value.extra == "dashboard"


def test_every_extra_is_installed_here() -> None:
    for extra in EXTRAS:
        require(extra, f"the test of {extra}")


@pytest.mark.parametrize(
    ("blocked", "args", "line"),
    [
        (
            ["flask"],
            ["dashboard"],
            "error: the dashboard needs the extra 'dashboard': "
            "pip install 'redis-lease[dashboard]'",
        ),
        (
            ["prometheus_client"],
            ["metrics"],
            "error: redis-lease metrics needs the extra 'metrics': "
            "pip install 'redis-lease[metrics]'",
        ),
        (
            ["fakeredis"],
            ["demo", "--backend", "embedded"],
            "error: the demo needs the extra 'demo': pip install 'redis-lease[demo]'",
        ),
        (
            ["fakeredis"],
            ["--url", "fakeredis://x", "runs"],
            "error: the embedded backend (fakeredis://) needs the extra 'demo': "
            "pip install 'redis-lease[demo]'",
        ),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(
    blocked: list[str], args: list[str], line: str
) -> None:
    # No Redis is named: the line comes before anything is contacted.
    done = run_without(blocked, "--url", "redis://127.0.0.1:1/0", *args)
    assert done.stderr.strip() == line
    assert done.returncode == 10


def test_the_library_entry_points_say_which_extra_to_install() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["waitress"] = None
        sys.modules["prometheus_client"] = None
        from redis_lease import MissingExtra
        for attempt in (
            lambda: __import__("redis_lease.operate.dashboard"),
            lambda: __import__("redis_lease").LeaseCollector,
        ):
            try:
                attempt()
            except MissingExtra as error:
                print(error.extra)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["dashboard", "metrics"]


def test_the_command_line_imports_no_optional_package() -> None:
    code = (
        "import sys, redis_lease.cli; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(_optional())!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def _optional() -> set[str]:
    return {module for modules in EXTRAS.values() for module in modules}


#: Runs the command line; at exit, names which of the given packages it imported.
_LOADED = """
import atexit, sys
watched = set({watched!r})
atexit.register(
    lambda: sys.stderr.write(
        "loaded: %s\\n" % sorted(watched & {{m.split(".")[0] for m in sys.modules}})
    )
)
sys.argv = ["redis-lease", *{args!r}]
from redis_lease.cli import main
main()
"""


def loaded(watched: set[str], *args: str) -> str:
    """Which of ``watched`` ``redis-lease ARGS`` imported, as its last stderr line says."""
    code = _LOADED.format(watched=sorted(watched), args=list(args))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stderr.splitlines()[-1]


def test_help_imports_neither_redis_nor_rq() -> None:
    heavy = {"redis", "rq", "croniter", "flask", "prometheus_client", "fakeredis"}
    assert loaded(heavy, "--help") == "loaded: []"
    assert loaded(heavy, "status", "--help") == "loaded: []"
    assert loaded(heavy, "--url", "redis://127.0.0.1:1/0", "worker", "--help") == "loaded: []"


def test_a_view_imports_no_rq(redis_url: str, prefix: str) -> None:
    heavy = {"redis", "rq", "rq_scheduler", "croniter", "flask", "prometheus_client"}
    assert loaded(heavy, "--url", redis_url, "--prefix", prefix, "status") == "loaded: ['redis']"
    assert loaded(heavy, "--url", redis_url, "--prefix", prefix, "runs") == "loaded: ['redis']"
