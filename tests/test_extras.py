"""Optional features: a missing extra is one line naming it, and the command line's
imports stay light (no web stack, metrics or embedded backend on a command's path)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import redis_lease
from redis_lease import Item, LeaseStore, MissingExtra, RedisLeaseError, extras
from redis_lease.extras import EXTRAS, install_command, optional_import, require

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
        f"the dashboard needs the extra 'dashboard': {install_command('dashboard')}"
    )
    assert raised.value.extra == "dashboard"


class Recorded:
    """A distribution whose ``direct_url.json`` says ``text`` (None: pip recorded none)."""

    def __init__(self, text: str | None) -> None:
        self.text = text

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return self.text


@pytest.mark.parametrize(
    ("recorded", "command"),
    [
        ('{"url": "file:///src/my%20clone", "dir_info": {}}', "pip install '/src/my clone[demo]'"),
        (
            '{"url": "file:///d/redis_lease-0.10.0-py3-none-any.whl", "archive_info": {}}',
            "pip install '/d/redis_lease-0.10.0-py3-none-any.whl[demo]'",
        ),
        (
            '{"url": "https://example.com/x.whl", "archive_info": {}}',
            "pip install 'redis-lease[demo]'",
        ),
        (None, "pip install 'redis-lease[demo]'"),
        ("not json", "pip install 'redis-lease[demo]'"),
    ],
)
def test_the_install_command_names_where_this_copy_came_from(
    monkeypatch: pytest.MonkeyPatch, recorded: str | None, command: str
) -> None:
    """A copy installed from a clone or a wheel is told to install from there: the package
    is not on the index, so ``pip install 'redis-lease[demo]'`` would fail for it."""
    monkeypatch.setattr(extras, "distribution", lambda name: Recorded(recorded))
    assert install_command("demo") == command


def test_every_extra_is_installed_here() -> None:
    for extra in EXTRAS:
        require(extra, f"the test of {extra}")


@pytest.mark.parametrize(
    ("blocked", "args", "line"),
    [
        (
            ["flask"],
            ["dashboard"],
            "error: the dashboard needs the extra 'dashboard': " + install_command("dashboard"),
        ),
        (
            ["prometheus_client"],
            ["metrics"],
            "error: redis-lease metrics needs the extra 'metrics': " + install_command("metrics"),
        ),
        (
            ["fakeredis"],
            ["demo", "--backend", "embedded"],
            "error: the demo needs the extra 'demo': " + install_command("demo"),
        ),
        (
            ["fakeredis"],
            ["--url", "fakeredis://x", "runs"],
            "error: the embedded backend (fakeredis://) needs the extra 'demo': "
            + install_command("demo"),
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
names = lambda: {{*sys.modules, *(m.split(".")[0] for m in sys.modules)}}
atexit.register(lambda: sys.stderr.write("loaded: %s\\n" % sorted(watched & names())))
sys.argv = ["redis-lease", *{args!r}]
from redis_lease.cli import main
main()
"""


def loaded(watched: set[str], *args: str) -> str:
    """Which of ``watched`` (packages, or modules by their full name) ``redis-lease ARGS``
    imported, as its last stderr line says."""
    code = _LOADED.format(watched=sorted(watched), args=list(args))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stderr.splitlines()[-1]


#: What a command line needs for none of its views: the web stack, the metrics, the
#: embedded backend, RQ. (typer reads every option's value through pydantic, so a view
#: imports it; ``--help`` alone does not.)
NOT_FOR_A_VIEW = {"flask", "prometheus_client", "fakeredis", "rq", "rq_scheduler"}


def test_the_app_and_its_commands_import_nothing_heavy() -> None:
    code = textwrap.dedent(
        """
        import sys, typer, typer.main
        from redis_lease.cli import app
        group = typer.main.get_command(app)
        names = group.list_commands(typer.Context(group))  # every command module imported
        assert "status" in names and "wait" in names, names
        print(sorted({*sys.modules, *(m.split(".")[0] for m in sys.modules)} & set(sys.argv[1:])))
        """
    )
    heavy = [*NOT_FOR_A_VIEW, "pydantic", "redis", "redis.asyncio", "croniter", "rich"]
    done = subprocess.run(
        [sys.executable, "-c", code, *heavy], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_help_imports_neither_redis_nor_rq() -> None:
    heavy = {"redis", "rq", "croniter", "flask", "prometheus_client", "fakeredis"}
    assert loaded({*heavy, "pydantic"}, "--help") == "loaded: []"
    assert loaded(heavy, "status", "--help") == "loaded: []"
    assert loaded(heavy, "--url", "redis://127.0.0.1:1/0", "worker", "--help") == "loaded: []"


def test_a_view_imports_no_rq(redis_url: str, prefix: str) -> None:
    heavy = {"redis", "rq", "rq_scheduler", "croniter", "flask", "prometheus_client"}
    assert loaded(heavy, "--url", redis_url, "--prefix", prefix, "status") == "loaded: ['redis']"
    assert loaded(heavy, "--url", redis_url, "--prefix", prefix, "runs") == "loaded: ['redis']"


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "r"],
        ["runs"],
        ["workers"],
        ["inspect", "r", "a"],
        ["wait", "r", "--timeout", "0"],
    ],
)
def test_a_view_of_a_real_run_imports_only_what_it_uses(
    real_store: LeaseStore, redis_url: str, args: list[str]
) -> None:
    real_store.add("r", [Item("a", {"n": 1}), Item("b", {"n": 2})], shards=2)
    others = {"redis_lease.cli.fleet", "redis_lease.cli.leases", "redis_lease.cli.schedules"}
    heavy = {*NOT_FOR_A_VIEW, "croniter", "rich", *others}  # rich: a terminal's tables only
    heavy.add("opentelemetry.trace")
    line = loaded(heavy, "--url", redis_url, "--prefix", real_store.prefix, *args, "--json")
    assert line == "loaded: []"


def test_each_command_is_listed_with_the_module_that_adds_it() -> None:
    import typer.main

    from redis_lease.cli.app import COMMAND_HOMES, COMMAND_MODULES, app

    group = typer.main.get_command(app)
    names = group.list_commands(typer.Context(group))  # type: ignore[attr-defined]
    homes = {
        info.name or typer.main.get_command_name(info.callback.__name__): info.callback.__module__
        for info in app.registered_commands
        if info.callback is not None
    }
    for info in app.registered_groups:
        assert info.typer_instance is not None
        first = info.typer_instance.registered_commands[0].callback
        homes[str(info.name)] = first.__module__
    assert sorted(names) == sorted(homes)
    assert {name: f"redis_lease.cli.{module}" for name, module in COMMAND_HOMES.items()} == homes
    assert set(COMMAND_HOMES.values()) == set(COMMAND_MODULES)
