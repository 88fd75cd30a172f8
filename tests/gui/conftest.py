"""GUI test fixtures: the offscreen Qt platform and a fresh SpecDeck data dir for every test."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from backends.paths import DATA_DIR_ENV, MODELS_DIR_ENV, models_dir
from backends.speculation.types import TokenOrigin

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from PySide6.QtCore import SignalInstance
    from pytestqt.qtbot import QtBot

    from gui.engine_client import EngineClient
    from gui.main_window import MainWindow
    from gui.settings import AppSettings

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


@contextmanager
def engine_wait(
    qtbot: QtBot, client: EngineClient, signal: SignalInstance, timeout: int
) -> Iterator[Any]:
    """``qtbot.waitSignal(signal)`` that fails at once, naming why, if the engine dies first.

    Yields pytest-qt's blocker (``args``: what ``signal`` carried).
    """
    deaths: list[str] = []

    def died(message: str, _death: object) -> None:
        deaths.append(message)

    client.crashed.connect(died)
    try:
        with qtbot.waitSignal(signal, timeout=timeout) as blocker:
            blocker.connect(client.crashed)
            yield blocker
    finally:
        client.crashed.disconnect(died)
    if deaths:
        pytest.fail(f"the engine process died instead: {deaths[0]}")


def assert_partial_answer_kept(window: MainWindow) -> None:
    """An answer cut short: its text stays on screen and in the history, marked an error."""
    shown = window.chat.answer_source()
    assert shown
    assert window.conversation_id is not None
    stored = window.store.messages(window.conversation_id)[-1]
    assert stored.state == "error"
    assert stored.content == shown


def smollm_pair_settings(model: Path, *, max_tokens: int) -> AppSettings:
    """Window settings for SmolLM2 drafting for itself, every round (so highlights exist)."""
    from gui.settings import AppSettings

    settings = AppSettings()
    settings.set("last_main_path", str(model))
    settings.set("last_draft_choice", str(model))
    settings.set("speculation_method", "draft-model")
    settings.set("context_size", 1024)
    settings.set("max_tokens", max_tokens)
    return settings


def shown_runs(pairs: Sequence[tuple[str, TokenOrigin]]) -> list[tuple[str, TokenOrigin]]:
    """What the chat shows of an answer of ``pairs`` (its Markdown rendered), merged runs."""
    from gui.markdown_layout import answer_layout, rendered_runs

    source = "".join(text for text, _ in pairs)
    origins = [origin for text, origin in pairs for _ in text]
    runs: list[tuple[str, TokenOrigin]] = []
    for text, origin in rendered_runs(answer_layout(source, origins)):
        who = origin or TokenOrigin.TARGET
        if runs and runs[-1][1] is who:
            runs[-1] = (runs[-1][0] + text, who)
        elif text:
            runs.append((text, who))
    return runs


def shown_text(pairs: Sequence[tuple[str, TokenOrigin]]) -> str:
    """The text the chat shows of an answer of ``pairs``."""
    return "".join(text for text, _ in shown_runs(pairs))


def shown_on(pairs: Sequence[tuple[str, TokenOrigin]], origin: TokenOrigin) -> str:
    """The shown text of ``origin``'s characters, line breaks aside (as on its background)."""
    from gui.markdown_layout import shown_text_of

    source = "".join(text for text, _ in pairs)
    return shown_text_of(source, [who for text, who in pairs for _ in text], origin)
