"""The window with its main model on llama.cpp RPC workers: real workers, real engine process."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QLineEdit

from backends.engines.rpc import REPLY_TIMEOUT_ENV
from backends.errors import SettingsError
from gui.crash_banner import RELOAD_TEXT
from gui.main_window import MainWindow
from gui.worker_loss import mentions_rpc_failure
from tests.gui.conftest import assert_partial_answer_kept, engine_wait, smollm_pair_settings
from tests.gui.test_main_window import _open_window
from tests.workers import Worker, free_port

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pytestqt.qtbot import QtBot

    from gui.settings import AppSettings

LOAD_TIMEOUT_MS = 120_000
ANSWER_TIMEOUT_MS = 180_000


@pytest.fixture
def workers() -> Iterator[tuple[Worker, Worker]]:
    first, second = Worker(), Worker()
    yield first, second
    first.kill()
    second.kill()


def _settings(model: Path, *workers: Worker) -> AppSettings:
    settings = smollm_pair_settings(model, max_tokens=24)
    settings.set("workers", ", ".join(str(worker) for worker in workers))
    settings.set("layer_split", ",".join(["1"] * len(workers) + ["0"]))
    return settings


def _start_a_long_answer(qtbot: QtBot, window: MainWindow) -> None:
    window.input.setPlainText("Tell a very long story about a lighthouse keeper.")
    window.send_message()
    answer = window.answer
    assert answer is not None
    qtbot.waitUntil(lambda: len(answer.tokens) >= 8, timeout=ANSWER_TIMEOUT_MS)


def test_the_window_places_the_main_model_on_workers_and_shows_them(
    qtbot: QtBot, smollm_path: Path, workers: tuple[Worker, Worker]
) -> None:
    first, second = workers
    window = _open_window(qtbot, _settings(smollm_path, first, second))
    try:
        assert window.loaded is not None
        placement = dict(window.loaded.main.layer_placement)
        assert set(placement) == {f"worker {first}", f"worker {second}"}
        assert window.loaded.draft is not None
        assert window.loaded.draft.layer_placement == ()  # the draft stays here
        label = window.status.workers_label
        qtbot.waitUntil(lambda: label.isVisible(), timeout=10_000)
        assert f"{first} ✓ {placement[f'worker {first}']} layers" in label.text()
        assert f"{second} ✓" in label.text()
        assert "GB free" in label.text()
        assert window.status.gpu_label.text() == "Main model on 2 workers, draft here"
        assert f"on worker {first}" in window.sidebar.placement_text()

        window.input.setPlainText("Say hello.")
        with engine_wait(qtbot, window.client, window.answer_finished, ANSWER_TIMEOUT_MS) as done:
            window.send_message()
        assert done.args == ["complete"]
        assert window.chat.answer_text()
    finally:
        window.shutdown()


@pytest.mark.heavy
def test_a_worker_killed_mid_answer_keeps_the_answer_and_reloads_without_it(
    qtbot: QtBot, smollm_path: Path, workers: tuple[Worker, Worker]
) -> None:
    keeper, leaver = workers
    settings = _settings(smollm_path, keeper, leaver)
    settings.set("max_tokens", 2000)
    window = _open_window(qtbot, settings)
    try:
        _start_a_long_answer(qtbot, window)
        with qtbot.waitSignal(window.answer_finished, timeout=60_000) as finished:
            leaver.kill()
        assert finished.args == ["error"]
        # Killed during a forward pass, llama.cpp aborts the engine process and the window
        # asks the workers which one went; killed between two passes, the engine finds its
        # connection closed first and says so itself. Either way the worker is named.
        qtbot.waitUntil(
            lambda: window.reload_button.text() == f"Reload without {leaver}", timeout=10_000
        )
        text = window.crash_label.text()
        if window.client.running:
            assert f"Worker {leaver} is gone (its connection closed)" in text
        else:
            assert f"Worker {leaver} stopped answering mid-answer (connection refused" in text
            assert mentions_rpc_failure(window.client.last_log_lines())
        # The partial answer is kept, on screen and in the history, with the reason.
        assert_partial_answer_kept(window)
        # No load crash was recorded: the settings were not at fault.
        last = window.last_load
        assert last is not None
        assert window.crash_records.choose((str(smollm_path),), last.risky)[1] is None

        with engine_wait(qtbot, window.client, window.models_loaded, LOAD_TIMEOUT_MS):
            QTest.mouseClick(window.reload_button, Qt.MouseButton.LeftButton)
        assert window.settings.get_str("workers") == str(keeper)
        assert window.loaded is not None
        placement = dict(window.loaded.main.layer_placement)  # by free memory now
        assert f"worker {keeper}" in placement
        assert f"worker {leaver}" not in placement
        assert window.reload_button.text() == RELOAD_TEXT
        window.settings.set("max_tokens", 8)
        window.input.setPlainText("Say hello.")
        with engine_wait(qtbot, window.client, window.answer_finished, ANSWER_TIMEOUT_MS) as done:
            window.send_message()
        assert done.args == ["complete"]
    finally:
        window.shutdown()


@pytest.mark.heavy
def test_a_hung_worker_aborts_the_engine_in_time_and_is_named(
    qtbot: QtBot, smollm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(REPLY_TIMEOUT_ENV, "2")  # the engine process inherits it
    worker = Worker()
    settings = _settings(smollm_path, worker)
    settings.set("max_tokens", 2000)
    window = _open_window(qtbot, settings)
    try:
        _start_a_long_answer(qtbot, window)
        with qtbot.waitSignal(window.answer_finished, timeout=60_000) as finished:
            worker.freeze()  # the socket stays open: only the reply timeout can notice
        assert finished.args == ["error"]
        assert not window.client.running
        text = window.crash_label.text()
        assert f"Worker {worker} stopped answering mid-answer (did not answer within" in text
        assert window.reload_button.text() == f"Reload without {worker}"
        assert window.chat.answer_text()
    finally:
        window.shutdown()
        worker.thaw()
        worker.kill()


def test_a_worker_gone_between_answers_is_named_before_the_next_answer(
    qtbot: QtBot, smollm_path: Path, workers: tuple[Worker, Worker]
) -> None:
    keeper, leaver = workers
    window = _open_window(qtbot, _settings(smollm_path, keeper, leaver))
    try:
        # The engine has reported on its workers (it asks them for their memory).
        qtbot.waitUntil(lambda: window.status.workers_label.isVisible(), timeout=10_000)
        leaver.kill()
        window.input.setPlainText("Say hello.")
        with engine_wait(qtbot, window.client, window.answer_finished, ANSWER_TIMEOUT_MS) as done:
            window.send_message()
        assert done.args == ["error"]
        qtbot.waitUntil(lambda: window.crash_banner.isVisible(), timeout=10_000)
        assert f"Worker {leaver} is gone" in window.crash_label.text()
        assert f"{leaver} ✗ gone" in window.status.workers_label.text()
        assert window.reload_button.text() == f"Reload without {leaver}"
        assert window.client.running  # no crash: the engine process lives
    finally:
        window.shutdown()


def test_an_unreachable_worker_is_a_one_line_sidebar_error(qtbot: QtBot, smollm_path: Path) -> None:
    closed = f"127.0.0.1:{free_port()}"
    settings = smollm_pair_settings(smollm_path, max_tokens=8)
    settings.set("workers", closed)
    window = MainWindow(settings, offer_first_run=False)
    qtbot.addWidget(window)
    window.show()
    try:
        with qtbot.waitSignal(window.load_gave_up, timeout=LOAD_TIMEOUT_MS) as gave_up:
            window.load_when_scanned()
        assert gave_up.args == [
            f"worker {closed} is unreachable: connection refused (is `specdeck worker` running?)"
        ]
        assert window.sidebar.error_text() == gave_up.args[0]
        assert window.client.running
        # Typed into the sidebar's Workers field; a malformed list never reaches the engine.
        field = window.sidebar.setting_widget("workers")
        assert isinstance(field, QLineEdit)
        field.clear()
        QTest.keyClicks(field, "10.0.0.5:http")
        QTest.keyClick(field, Qt.Key.Key_Return)
        assert settings.get_str("workers") == "10.0.0.5:http"
        with pytest.raises(SettingsError, match="port must be a number"):
            window.sidebar.load_request()
        field.clear()
        QTest.keyClicks(field, "10.0.0.5:50052, 10.0.0.6")
        QTest.keyClick(field, Qt.Key.Key_Return)
        assert window.sidebar.load_request().workers == ("10.0.0.5:50052", "10.0.0.6:50052")
        assert "Main model on 2 workers" in window.status.estimate_label.text()
    finally:
        window.shutdown()
