"""The documentation's snippet runner: every python and bash block of README.md and
docs/**/*.md runs as a reader following the page would run it (see tests/test_snippets.py)."""
