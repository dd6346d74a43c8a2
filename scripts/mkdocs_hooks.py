"""mkdocs hooks: docs/reference/cli.md gets the command line reference, generated from the
typer app at build time by typer's own ``utils docs`` (the generator mkdocs-typer2 calls).

typer 0.29 no longer builds on click, so neither mkdocs-click nor mkdocs-typer2's
native engine can read the app, and mkdocs-typer2's legacy engine renders the usage
lines without code blocks and an empty page when the command fails. Here a failure, or
a command missing from the text, fails the build. The list of commands is replaced by
the groups ``redis-lease --help`` shows (redis_lease/cli/help_text.py), each command
linked to its section.
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
from typing import Any

PLACEHOLDER = "<!-- generated: the command line reference -->"
PAGE = "reference/cli.md"


def command_names() -> list[str]:
    """The names of the app's commands."""
    import typer.main

    from redis_lease.cli import app

    group: Any = typer.main.get_command(app)
    return sorted(group.list_commands(None))  # lists (and makes) every command, as help does


def command_groups() -> str:
    """The commands in the groups and order of ``redis-lease --help``, with their summaries."""
    import typer
    import typer.main

    from redis_lease.cli import app

    group: Any = typer.main.get_command(app)
    ctx = typer.Context(group, info_name="redis-lease")
    lines: list[str] = []
    current = None
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        panel = command.rich_help_panel or "Other commands"
        if panel != current:
            lines += ["", f"**{panel}**:", ""]
            current = panel
        text = html.escape(command.get_short_help_str(), quote=False)
        lines.append(f"* [`{name}`](#redis-lease-{name}): {text}")
    return "\n".join(lines).lstrip("\n") + "\n"


def cli_reference() -> str:
    """typer's Markdown for ``redis-lease`` and every command, one heading level down."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "typer",
            "redis_lease.cli",
            "utils",
            "docs",
            "--name",
            "redis-lease",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"typer utils docs failed: {done.stderr.strip()}")
    text = re.sub(r"^(#+) ", r"#\1 ", done.stdout, flags=re.MULTILINE)
    listed = re.compile(r"^\*\*Commands\*\*:\n\n(?:\* .*\n)+", re.MULTILINE)
    text = listed.sub(lambda _: command_groups(), text, count=1)
    missing = [n for n in command_names() if f"## `redis-lease {n}`" not in text]
    if missing:
        raise RuntimeError(f"the CLI reference lacks the commands {missing}")
    return text


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Puts the CLI reference in place of its placeholder."""
    if page.file.src_uri != PAGE:
        return markdown
    if PLACEHOLDER not in markdown:
        raise RuntimeError(f"{PAGE} lacks the line {PLACEHOLDER}")
    return markdown.replace(PLACEHOLDER, cli_reference())
