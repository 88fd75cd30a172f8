"""The Local server switch: the window's loaded pair answers other programs, shown as it goes."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import openai
import pytest
from PySide6.QtWidgets import QApplication

from backends.service.protocol import LoadRequest
from backends.speculation.types import SpeculationStats
from gui.main_window import MainWindow
from gui.server_panel import ServerPanel, request_line
from tests.gui.conftest import engine_wait, smollm_pair_settings
from tests.test_api_server import free_port

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pytestqt.qtbot import QtBot

LOAD_TIMEOUT_MS = 120_000
ANSWER_TIMEOUT_MS = 180_000


def test_the_panel_asks_to_serve_and_shows_what_the_engine_says(qtbot: QtBot) -> None:
    panel = ServerPanel()
    qtbot.addWidget(panel)
    panel.port.setValue(9123)
    with qtbot.waitSignal(panel.serve_requested) as asked:
        panel.switch.setChecked(True)
    assert asked.args == ["127.0.0.1", 9123, ""]  # this computer only, no key needed
    assert not panel.port.isEnabled()
    assert not panel.address.isEnabled()
    panel.set_serving(True, "http://127.0.0.1:9123/v1", "")
    assert panel.status.text() == "Listening on http://127.0.0.1:9123/v1"
    panel.set_waiting(2)
    assert panel.status.text().endswith("2 in the queue")
    stats = SpeculationStats(
        generated_tokens=41,
        total_draft_tokens_count=20,
        accepted_draft_tokens_count=15,
        generation_seconds=2.0,
    )
    panel.add_request(stats)
    assert panel.log.count() == 1
    assert "41 tokens · 20.0 tok/s · 75% accepted" in panel.log.item(0).text()
    # The port was taken: the engine says so, the switch goes back off.
    panel.set_serving(False, "", "cannot listen on 127.0.0.1:9123: Address already in use")
    assert not panel.switch.isChecked()
    assert panel.port.isEnabled()
    assert panel.status.text().startswith("Not serving: cannot listen")
    with qtbot.waitSignal(panel.stop_requested, timeout=500, raising=False) as stopped:
        pass
    assert not stopped.signal_triggered  # going back off by itself asks nothing


def test_other_machines_need_an_api_key(qtbot: QtBot) -> None:
    panel = ServerPanel()
    qtbot.addWidget(panel)
    hosts = [panel.address.itemData(i) for i in range(panel.address.count())]
    assert hosts[:2] == ["127.0.0.1", "0.0.0.0"]
    assert panel.api_key.text() == ""
    # Choosing every network makes a key at once, so the switch works and is safe.
    panel.set_host("0.0.0.0")
    key = panel.api_key.text()
    assert key.startswith("sd-")
    assert len(key) > 30
    with qtbot.waitSignal(panel.serve_requested) as asked:
        panel.switch.setChecked(True)
    assert asked.args == ["0.0.0.0", panel.port.value(), key]
    assert not panel.api_key.isEnabled()
    panel.set_serving(True, "http://0.0.0.0:8765/v1", "")
    assert panel.status.text() == "Listening on http://0.0.0.0:8765/v1 · API key required"
    panel.switch.setChecked(False)
    # Without a key the panel refuses, names the problem and asks the engine nothing.
    panel.api_key.clear()
    with qtbot.waitSignal(panel.serve_requested, timeout=300, raising=False) as asked_again:
        panel.switch.setChecked(True)
    assert not asked_again.signal_triggered
    assert not panel.switch.isChecked()
    assert panel.status.text() == (
        "Not serving: other machines may connect on 0.0.0.0: give an API key (New makes one)"
    )
    panel.new_key.click()
    assert panel.api_key.text().startswith("sd-")
    assert panel.api_key.text() != key
    panel.copy_key.click()
    assert QApplication.clipboard().text() == panel.api_key.text()
    # A saved address that this machine no longer has falls back to this computer only.
    panel.set_host("203.0.113.9")
    assert panel.host() == "127.0.0.1"


def test_request_line_says_when_the_client_left() -> None:
    stats = SpeculationStats(generated_tokens=3, stop_reason="cancelled")
    assert request_line(stats, 0.0).endswith("client left")


@pytest.fixture
def window(qtbot: QtBot, smollm_path: Path) -> Iterator[MainWindow]:
    window = MainWindow(smollm_pair_settings(smollm_path, max_tokens=40), offer_first_run=False)
    qtbot.addWidget(window)
    window.show()
    with engine_wait(qtbot, window.client, window.models_loaded, LOAD_TIMEOUT_MS):
        window.load_when_scanned()
    yield window
    window.shutdown()


def serve_on_a_free_port(qtbot: QtBot, window: MainWindow) -> int:
    """Switch the window's Local server on, on a free port of this computer; the port."""
    panel = window.sidebar.server_panel
    port = free_port()
    panel.port.setValue(port)
    with engine_wait(qtbot, window.client, window.client.serving, 30_000) as serving:
        panel.switch.setChecked(True)
    assert serving.args[0] is True, serving.args
    return port


def test_the_window_serves_its_loaded_pair_and_the_meter_follows(
    qtbot: QtBot, window: MainWindow, smollm_path: Path
) -> None:
    panel = window.sidebar.server_panel
    port = serve_on_a_free_port(qtbot, window)
    assert panel.status.text() == f"Listening on http://127.0.0.1:{port}/v1"
    assert window.settings.get_int("server_port") == port  # offered again next start
    answers: dict[str, Any] = {}

    def ask() -> None:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
        answers["reply"] = client.chat.completions.create(
            model=smollm_path.stem,
            messages=[{"role": "user", "content": "Write a haiku about rain."}],
            max_tokens=24,
        )

    asking = threading.Thread(target=ask)
    with engine_wait(qtbot, window.client, window.client.api_finished, ANSWER_TIMEOUT_MS) as done:
        asking.start()
    asking.join(timeout=60)
    stats: SpeculationStats = done.args[2]
    reply = answers["reply"]
    assert reply.usage.completion_tokens == stats.generated_tokens
    # The request log and the meter show the API answer, as for a chat answer.
    assert panel.log.count() == 1
    assert f"{stats.generated_tokens} tokens" in panel.log.item(0).text()
    assert window.meter.state == "done"
    assert window.meter.overall_acceptance == pytest.approx(stats.acceptance_rate)
    assert "API" in window.meter.value_texts()["caption"]
    # Nothing was loaded twice: the window's pair is still the one loaded, and still answers.
    assert window.loaded is not None
    with engine_wait(qtbot, window.client, window.client.serving, 30_000) as stopped:
        panel.switch.setChecked(False)
    assert stopped.args[0] is False
    assert panel.status.text() == "Off"
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0
        ).models.list()


def test_the_window_serves_other_machines_only_with_the_key(
    qtbot: QtBot, window: MainWindow, smollm_path: Path
) -> None:
    panel = window.sidebar.server_panel
    port = free_port()
    panel.port.setValue(port)
    panel.set_host("0.0.0.0")
    key = panel.api_key.text()
    with engine_wait(qtbot, window.client, window.client.serving, 30_000) as serving:
        panel.switch.setChecked(True)
    assert serving.args[0] is True, serving.args
    assert panel.status.text().endswith("API key required")
    # The address and key are offered again next start.
    assert window.settings.get_str("server_host") == "0.0.0.0"
    assert window.settings.get_str("server_api_key") == key
    base_url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    models = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0).models.list()
    assert smollm_path.stem in [model.id for model in models.data]
    with engine_wait(qtbot, window.client, window.client.serving, 30_000):
        panel.switch.setChecked(False)


def test_the_api_follows_a_pair_loaded_while_it_serves(
    qtbot: QtBot, window: MainWindow, smollm_path: Path, tmp_path: Path
) -> None:
    panel = window.sidebar.server_panel
    port = serve_on_a_free_port(qtbot, window)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
    assert [model.id for model in client.models.list().data] == [smollm_path.stem] * 2
    # Another main model (the same weights under another name), and no draft model.
    other = tmp_path / "other-main.gguf"
    other.symlink_to(smollm_path)
    with engine_wait(qtbot, window.client, window.models_loaded, LOAD_TIMEOUT_MS):
        window.load_models(LoadRequest(str(other), method="ngram-mod", n_ctx=1024))
    listed = client.models.list().data
    assert [(model.id, (model.model_extra or {})["specdeck"]["role"]) for model in listed] == [
        ("other-main", "main")
    ]
    with pytest.raises(openai.NotFoundError, match="this server answers with .other-main."):
        client.chat.completions.create(
            model=smollm_path.stem, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
    answers: dict[str, Any] = {}

    def ask() -> None:
        answers["reply"] = client.chat.completions.create(
            model="other-main", messages=[{"role": "user", "content": "Hi"}], max_tokens=8
        )

    asking = threading.Thread(target=ask)
    with engine_wait(qtbot, window.client, window.client.api_finished, ANSWER_TIMEOUT_MS):
        asking.start()
    asking.join(timeout=60)
    assert answers["reply"].model == "other-main"
    listening = f"Listening on http://127.0.0.1:{port}/v1"
    qtbot.waitUntil(lambda: panel.status.text() == listening, timeout=5000)  # queue emptied
    with engine_wait(qtbot, window.client, window.client.serving, 30_000):
        panel.switch.setChecked(False)
