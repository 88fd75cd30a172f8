"""SpecDeck's installed version, for the window's About box and the API's description."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def app_version() -> str:
    """The installed version of SpecDeck ("0.0.0+unknown" when run from a bare source tree)."""
    try:
        return version("specdeck")
    except PackageNotFoundError:
        return "0.0.0+unknown"
