"""GUI test fixtures: the offscreen Qt platform and a fresh SpecDeck data dir for every test."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from backends.paths import DATA_DIR_ENV, MODELS_DIR_ENV, models_dir

if TYPE_CHECKING:
    from pathlib import Path

# Before any QApplication exists: no display on CI machines.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

# The real models stay where the session fetched them; everything else goes to a temp dir.
_REAL_MODELS_DIR = models_dir()


@pytest.fixture(autouse=True)
def fresh_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Settings, chats and logs of each test live in its own folder, never the user's."""
    data_dir = tmp_path / "specdeck-data"
    monkeypatch.setenv(DATA_DIR_ENV, str(data_dir))
    monkeypatch.setenv(MODELS_DIR_ENV, str(_REAL_MODELS_DIR))
    return data_dir
