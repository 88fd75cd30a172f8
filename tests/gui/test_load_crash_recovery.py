"""The window survives an engine that dies while loading: one safe retry, remembered, no loop.

The engine process is made to die with a real SIGSEGV at a chosen load stage
(``$SPECDECK_CRASH_AT``), so this runs on every CPU, not only on those where llama.cpp
itself crashes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from backends.engines.load_guard import CRASH_AT_ENV, SAFEST, CrashRecords, RiskySettings
from gui.chat_store import ChatStore
from gui.main_window import MainWindow
from tests.gui.conftest import engine_wait, smollm_pair_settings

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pytestqt.qtbot import QtBot

    from gui.engine_client import EngineDeath
    from gui.settings import AppSettings

LOAD_TIMEOUT_MS = 120_000
ANSWER_TIMEOUT_MS = 180_000
REQUESTED = RiskySettings("auto", -1, None)  # what the window asks for by default


@pytest.fixture
def settings(smollm_path: Path) -> AppSettings:
    return smollm_pair_settings(smollm_path, max_tokens=24)


@pytest.fixture
def earlier_chat() -> int:
    """A conversation saved before this start: a question and a partial answer."""
    store = ChatStore(ChatStore.default_path())
    conversation = store.create_conversation()
    store.add_message(conversation, "user", "What is two plus two?")
    answer = store.begin_answer(conversation, "draft-model")
    store.update_answer(answer, "Four.", [])
    store.close()
    return conversation


class _Window:
    """The window, the engine deaths it saw, and the settings of every load it sent."""

    def __init__(self, qtbot: QtBot, settings: AppSettings) -> None:
        self.window = MainWindow(settings, offer_first_run=False)
        qtbot.addWidget(self.window)
        self.window.show()
        self.deaths: list[EngineDeath] = []
        self.window.client.crashed.connect(lambda _message, death: self.deaths.append(death))
        self.sent: list[RiskySettings] = []
        original = self.window.client.load

        def load(request: object) -> None:
            self.sent.append(request.risky)  # type: ignore[attr-defined]
            original(request)  # type: ignore[arg-type]

        self.window.client.load = load  # type: ignore[method-assign]


@pytest.fixture
def opened(qtbot: QtBot, settings: AppSettings) -> Iterator[_Window]:
    opened = _Window(qtbot, settings)
    yield opened
    opened.window.shutdown()


def test_a_crash_while_loading_is_retried_once_with_the_safest_settings(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch, opened: _Window, earlier_chat: int
) -> None:
    monkeypatch.setenv(CRASH_AT_ENV, "main-probe:unless-safe")
    window = opened.window
    with qtbot.waitSignal(window.models_loaded, timeout=LOAD_TIMEOUT_MS):
        window.load_when_scanned()
    assert opened.sent == [REQUESTED, SAFEST]
    assert len(opened.deaths) == 1
    banner = window.crash_label.text()
    assert window.crash_banner.isVisible()
    assert "SIGSEGV" in banner
    assert "first forward pass" in banner
    assert "weight repacking auto, GPU layers all, default threads" in banner
    assert "Loaded again with the safest settings" in banner  # the retry worked
    assert "\n" not in banner
    assert not window.reload_button.isVisible()
    placement = window.sidebar.placement_text()
    assert "safest settings" in placement
    assert "weight repacking off" in placement
    crash = CrashRecords().find(window.settings.get_str("last_main_path"), REQUESTED)
    assert crash is not None
    assert crash.stage == "main-probe"
    # Nothing of the earlier chat is lost, and the safely loaded pair answers.
    window.open_conversation(earlier_chat)
    assert [m.content for m in window.store.messages(earlier_chat)] == [
        "What is two plus two?",
        "Four.",
    ]
    window.input.setPlainText("And three plus three?")
    with engine_wait(qtbot, window.client, window.answer_finished, ANSWER_TIMEOUT_MS) as done:
        window.send_message()
    assert done.args == ["complete"]
    assert len(window.store.messages(earlier_chat)) == 4


def test_the_next_start_loads_with_the_safest_settings_at_once(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch, opened: _Window, smollm_path: Path
) -> None:
    CrashRecords().record(smollm_path, REQUESTED, "main-probe", "SIGSEGV: Segmentation fault")
    monkeypatch.setenv(CRASH_AT_ENV, "main-probe:unless-safe")
    window = opened.window
    with engine_wait(qtbot, window.client, window.models_loaded, LOAD_TIMEOUT_MS):
        window.load_when_scanned()
    assert opened.sent == [SAFEST]
    assert opened.deaths == []
    assert not window.crash_banner.isVisible()
    placement = window.sidebar.placement_text()
    assert "• safest settings: SmolLM2-135M-Instruct.Q4_1.gguf crashed the engine" in placement
    assert "with weight repacking auto, GPU layers all, default threads" in placement


def test_a_crash_with_the_safest_settings_too_gives_up_and_reload_never_loops(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch, opened: _Window
) -> None:
    monkeypatch.setenv(CRASH_AT_ENV, "main-probe")
    window = opened.window
    with qtbot.waitSignal(window.load_gave_up, timeout=LOAD_TIMEOUT_MS) as gave_up:
        window.load_when_scanned()
    assert opened.sent == [REQUESTED, SAFEST]
    assert len(opened.deaths) == 2
    assert "Nothing safer is left to try" in window.crash_label.text()
    assert "no weight repacking, no GPU offload" in gave_up.args[0]
    assert not window.reload_button.isVisible()
    assert window.loaded is None
    assert not window.send_button.isEnabled()
    # Reload (or Load) walks into no crash: the records refuse at once, with one line.
    with qtbot.waitSignal(window.load_gave_up, timeout=1000) as refused:
        window.reload_models()
    assert "will not load it again by itself" in refused.args[0]
    assert "will not load it again by itself" in window.sidebar.error_text()
    assert opened.sent == [REQUESTED, SAFEST]
    assert len(opened.deaths) == 2
    assert not window.client.running
    # Forgetting the crashes lets it try again (and crash again, here).
    window.forget_load_crashes()
    with qtbot.waitSignal(window.load_gave_up, timeout=LOAD_TIMEOUT_MS):
        window.reload_models()
    assert len(opened.deaths) == 4
