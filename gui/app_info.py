"""The app's name and version: a leaf every window part may import without import cycles."""

from __future__ import annotations

from backends.version import app_version

APP_NAME = "SpecDeck"

__all__ = ["APP_NAME", "app_version"]
