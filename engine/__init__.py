"""specprobe's engine: a declarative spec -> plan -> legs -> evidence -> verdict (see engine/cli.py)."""

from __future__ import annotations


def version() -> str:
    """The installed specprobe version (pyproject's), "0.0.0" when running from an uninstalled tree."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("specprobe")
    except PackageNotFoundError:
        return "0.0.0"
