"""Find my fastest setup in the window: real trials in the engine process, shown and applied."""

from __future__ import annotations

import os
import re
import shutil
from typing import TYPE_CHECKING

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from backends.engines.load_guard import CRASH_AT_ENV
from backends.paths import MODELS_DIR_ENV
from gui.settings import DRAFT_CHOICE_NGRAM, AppSettings
from gui.style import DARK, LIGHT
from tests.gui.conftest import engine_wait, smollm_pair_settings
from tests.gui.test_main_window import LOAD_TIMEOUT_MS, _open_window

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from PySide6.QtGui import QColor
    from pytestqt.qtbot import QtBot

    from gui.main_window import MainWindow
    from gui.tuning_dialog import TuningDialog

TUNE_TIMEOUT_MS = 240_000


@pytest.fixture
def window(qtbot: QtBot, smollm_path: Path) -> Iterator[MainWindow]:
    window = _open_window(qtbot, smollm_pair_settings(smollm_path, max_tokens=16))
    yield window
    window.shutdown()


def marked_rows(dialog: TuningDialog) -> dict[str, QColor]:
    """The result rows whose setup is marked, by label, with the colour they are marked in."""
    marked = {}
    for index in range(dialog.results.rowCount()):
        cell = dialog.results.item(index, 0)
        assert cell is not None
        if cell.background().style() != Qt.BrushStyle.NoBrush:
            marked[cell.text()] = cell.background().color()
    return marked


def _open_dialog(qtbot: QtBot, window: MainWindow) -> TuningDialog:
    button = window.sidebar.findChild(type(window.send_button), "tuneButton")
    assert button is not None
    assert button.isEnabled()
    with engine_wait(qtbot, window.client, window.client.tuned, 30_000):
        QTest.mouseClick(button, Qt.MouseButton.LeftButton)
    dialog = window.fastest_setup.dialog
    assert dialog is not None
    assert dialog.isVisible()
    return dialog


@pytest.mark.heavy
def test_the_trials_run_rank_and_apply_the_fastest_setup(
    qtbot: QtBot, window: MainWindow, smollm_path: Path
) -> None:
    dialog = _open_dialog(qtbot, window)
    assert dialog.status.text() == "Not measured on this machine yet: press Start."
    assert "the suite's 3 prompts" in dialog.intro.text()
    # Every other local model is listed with its verdict and the reason, in one line.
    drafts = {name: (verdict, why) for name, verdict, why in dialog.draft_rows()}
    assert drafts["gemma-3-270m-q4_k_m.gguf"][0] == "cannot draft"
    assert drafts["gemma-3-270m-q4_k_m.gguf"][1].startswith("another family (gemma3; main: llama)")
    assert smollm_path.name not in drafts  # the main model itself is not offered as its draft
    dialog.budget.setValue(20)
    with engine_wait(qtbot, window.client, window.client.tuned, TUNE_TIMEOUT_MS) as tuned:
        QTest.mouseClick(dialog.start_button, Qt.MouseButton.LeftButton)
        # While the trials run, nothing else may use the engine.
        assert not window.send_button.isEnabled()
        assert not window.stop_button.isEnabled()
        assert not dialog.start_button.isEnabled()
        assert dialog.cancel_button.isEnabled()
    assert tuned.args[1] is False  # measured, not recalled
    rows = {cells[0]: cells for cells in dialog.result_rows()}
    assert {"plain", "ngram-mod", "ngram-simple", "edit-copy", "auto (n-gram only)"} == set(rows)
    assert rows["plain"][2] == "1.00×"
    assert all(cells[6] == "yes" for cells in rows.values() if len(cells) > 6 and cells[6])
    # As many of the 3 prompts as the budget allows here (on a 2-core Zen 1, one).
    assert re.match(r"Measured now \((3 prompts|2 prompts|1 prompt) ", dialog.status.text())
    assert dialog.why.text().startswith("<b>")  # the fastest row is selected and explained
    assert window.send_button.isEnabled()
    best = tuned.args[0].winner
    assert best is not None
    # The fastest setup is marked in the draft's colour, and follows a change of theme.
    assert marked_rows(dialog) == {best.label: LIGHT.draft_background}
    window.settings.set("theme", "dark")
    assert marked_rows(dialog) == {best.label: DARK.draft_background}
    window.settings.set("theme", "light")
    assert marked_rows(dialog) == {best.label: LIGHT.draft_background}
    hint = window.sidebar.findChild(type(dialog.status), "tuningHint")
    assert hint is not None
    assert hint.text().startswith("Fastest here: ")
    assert dialog.use_button.isEnabled()
    # Use it: the sidebar picks the winner and loads it.
    with engine_wait(qtbot, window.client, window.models_loaded, LOAD_TIMEOUT_MS):
        QTest.mouseClick(dialog.use_button, Qt.MouseButton.LeftButton)
    assert not dialog.isVisible()
    assert window.loaded is not None
    assert window.loaded.method == best.method
    assert window.sidebar.selected_draft_choice() != str(smollm_path)
    assert hint.text().startswith("Fastest here: ")  # still true of the model now loaded
    # Opened again, the result is the one remembered for this model and machine.
    dialog = _open_dialog(qtbot, window)
    assert dialog.status.text().startswith("Measured ")
    assert "on this machine" in dialog.status.text()
    assert {cells[0] for cells in dialog.result_rows()} == set(rows)


@pytest.mark.heavy
def test_cancel_ends_the_trials_and_keeps_what_was_measured(
    qtbot: QtBot, window: MainWindow
) -> None:
    dialog = _open_dialog(qtbot, window)
    dialog.budget.setValue(300)
    with engine_wait(qtbot, window.client, window.client.tune_progress, 60_000):
        QTest.mouseClick(dialog.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "ngram" in dialog.status.text(), timeout=TUNE_TIMEOUT_MS)
    with engine_wait(qtbot, window.client, window.client.tuned, 60_000) as tuned:
        QTest.mouseClick(dialog.cancel_button, Qt.MouseButton.LeftButton)
    assert tuned.args[2] is True  # cancelled
    assert dialog.status.text().startswith("Cancelled")
    skipped = [cells for cells in dialog.result_rows() if cells[1] == "not tried: cancelled"]
    assert skipped
    assert dialog.start_button.isEnabled()
    # The loaded pair answers as before.
    assert window.loaded is not None
    assert window.send_button.isEnabled()


@pytest.mark.heavy
def test_a_crash_during_a_trial_is_the_crash_path_and_the_chats_stay(
    qtbot: QtBot,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    smollm_path: Path,
) -> None:
    # A second file of the same model: a compatible draft the trials load (and crash on).
    models = tmp_path / "models"
    models.mkdir()
    main = models / smollm_path.name
    try:
        os.link(smollm_path, main)
    except OSError:
        shutil.copyfile(smollm_path, main)
    shutil.copyfile(main, models / "smollm-twin.gguf")
    monkeypatch.setenv(MODELS_DIR_ENV, str(models))
    monkeypatch.setenv(CRASH_AT_ENV, "draft-model")  # fault injection: a trial draft's load
    settings = AppSettings()
    settings.set("last_main_path", str(main))
    settings.set("last_draft_choice", DRAFT_CHOICE_NGRAM)
    settings.set("speculation_method", "ngram-mod")
    settings.set("context_size", 1024)
    window = _open_window(qtbot, settings)
    try:
        conversation = window.store.create_conversation()
        window.store.add_message(conversation, "user", "Write a haiku about rain.")
        dialog = _open_dialog(qtbot, window)
        assert "your last 1 message" in dialog.intro.text()
        assert "the 1 compatible draft" in dialog.intro.text()
        dialog.budget.setValue(30)
        with qtbot.waitSignal(window.client.crashed, timeout=TUNE_TIMEOUT_MS):
            QTest.mouseClick(dialog.start_button, Qt.MouseButton.LeftButton)
        assert dialog.status.text().startswith("The trials stopped: ")
        assert "the chats are safe" in dialog.status.text()
        assert dialog.start_button.isEnabled()
        assert window.crash_banner.isVisible()
        assert window.store.messages(conversation)[0].content == "Write a haiku about rain."
        # Run again with no engine: one line, and the dialog is not left waiting.
        QTest.mouseClick(dialog.start_button, Qt.MouseButton.LeftButton)
        assert dialog.status.text().startswith("The trials stopped: no model is loaded")
        assert not window.fastest_setup.running
    finally:
        window.shutdown()
