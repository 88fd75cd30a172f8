"""Where SpecDeck keeps its data: the user data dir, overridable for tests and portable installs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import platformdirs

APP_NAME = "SpecDeck"
DATA_DIR_ENV = "SPECDECK_DATA_DIR"
MODELS_DIR_ENV = "SPECDECK_MODELS_DIR"
CACHE_DIR_ENV = "SPECDECK_CACHE_DIR"


def user_data_dir() -> Path:
    """The folder for chats, settings and models (``$SPECDECK_DATA_DIR`` wins)."""
    override = os.environ.get(DATA_DIR_ENV)
    return (
        Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    )


def models_dir() -> Path:
    """SpecDeck's own model folder (``$SPECDECK_MODELS_DIR`` wins, else ``<data dir>/models``)."""
    override = os.environ.get(MODELS_DIR_ENV)
    return Path(override) if override else user_data_dir() / "models"


def cache_dir() -> Path:
    """The folder for files SpecDeck can make again (``$SPECDECK_CACHE_DIR`` wins)."""
    override = os.environ.get(CACHE_DIR_ENV)
    return (
        Path(override) if override else Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    )


def write_json_atomically(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename.

    A reader never sees half a file, and a crash mid-write leaves the old one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(temporary, path)
