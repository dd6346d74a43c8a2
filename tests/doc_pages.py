"""The documentation's pages: README.md and every Markdown file under docs/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def page_paths() -> list[str]:
    """README.md and every page under docs/, relative to the repository."""
    docs = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))
    return ["README.md", *docs]


def pages() -> dict[str, str]:
    """Every page's text, by its path."""
    return {path: (ROOT / path).read_text() for path in page_paths()}
