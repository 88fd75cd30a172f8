"""The app's name and version: a leaf every window part may import without import cycles."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

APP_NAME = "SpecDeck"


def app_version() -> str:
    """The installed version of SpecDeck."""
    try:
        return version("specdeck")
    except PackageNotFoundError:
        return "0.0.0+unknown"
