"""The Download models dialog on real widgets, with the real hub client against the stand-in."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from backends.models import hub
from backends.models.gguf_info import read_model_info
from backends.models.hub import fits_here
from gui.hub_dialog import (
    CHECKING_TEXT,
    FITS_COLUMN,
    PROGRESS_STEPS,
    RESUME_TEXT,
    VERDICT_COLUMN,
    HubDialog,
)
from gui.main_window import MainWindow
from gui.settings import AppSettings
from tests.conftest import GATED_REPO, SMOLLM_REPO, TOKEN
from tests.gui.conftest import engine_wait, smollm_pair_settings
from tests.hub_standin import (
    HubRepo,
    HubStandin,
    instant_client_retries,
    point_client_at,
    serve_hub,
)

if TYPE_CHECKING:
    from pytestqt.qtbot import QtBot

WAIT_MS = 30_000
HUGE_CONTEXT = 4_000_000  # tokens: SmolLM2's KV cache of it is about 92 GB


def open_dialog(qtbot: QtBot, main: Path | None, models: Path) -> HubDialog:
    dialog = HubDialog(read_model_info(main) if main else None, models)
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def search_and_pick(
    qtbot: QtBot, dialog: HubDialog, query: str, repo_id: str, *, until_listed: bool = True
) -> None:
    """Search, pick ``repo_id`` and (unless told not to) wait until its listing is over."""
    dialog.query_edit.setText(query)
    QTest.mouseClick(dialog.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: repo_id in dialog.repo_ids(), timeout=WAIT_MS)
    dialog.repo_list.setCurrentRow(dialog.repo_ids().index(repo_id))
    if until_listed:
        qtbot.waitUntil(
            lambda: not dialog.busy() and dialog.file_table.rowCount() > 0, timeout=WAIT_MS
        )


def test_fits_here_says_ram_and_gpu() -> None:
    assert fits_here(100, 1000, None) == "RAM ✓"
    assert fits_here(1000, 1000, None) == "RAM ✗"  # a fifth more than the file is needed
    assert fits_here(100, 1000, (50, "GPU")) == "RAM ✓ · GPU ✗"
    assert fits_here(100, 1000, None, needed=1001) == "RAM ✗"  # the header's estimate
    assert fits_here(1000, 1000, (900, "GPU"), needed=900) == "RAM ✓ · GPU ✓"


def test_a_file_says_whether_it_can_draft_before_it_is_downloaded(
    qtbot: QtBot, standin: HubStandin, smollm_path: Path, gemma_path: Path, tmp_path: Path
) -> None:
    dialog = open_dialog(qtbot, gemma_path, tmp_path / "models")
    search_and_pick(qtbot, dialog, "smollm2", SMOLLM_REPO)
    assert dialog.cell(0, 0) == smollm_path.name
    assert dialog.cell(0, 1) == "Q4_1"
    assert dialog.cell(0, 3).startswith("RAM ")
    qtbot.waitUntil(lambda: dialog.cell(0, VERDICT_COLUMN) != CHECKING_TEXT, timeout=WAIT_MS)
    assert dialog.cell(0, VERDICT_COLUMN).startswith("cannot draft:"), dialog.cell(0, 4)
    assert all(get.range for get in standin.file_gets())  # the header only

    same = open_dialog(qtbot, smollm_path, tmp_path / "models")
    search_and_pick(qtbot, same, "smollm2", SMOLLM_REPO)
    qtbot.waitUntil(lambda: same.cell(0, VERDICT_COLUMN) != CHECKING_TEXT, timeout=WAIT_MS)
    assert same.cell(0, VERDICT_COLUMN).startswith("can draft: same tokenizer"), same.cell(0, 4)
    assert same.cell(0, FITS_COLUMN).startswith("RAM ✓")


def test_once_its_header_is_read_a_file_s_fit_counts_the_context(
    qtbot: QtBot,
    standin: HubStandin,
    smollm_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SmolLM2's 98 MB fit in 8 GB free; its KV cache at 4 million tokens (30 layers, K and V
    of 192 values each) does not: the fit says so once the header has been read."""
    monkeypatch.setattr("gui.hub_dialog.available_memory", lambda: 8 << 30)
    header_wanted, header_may_go = threading.Event(), threading.Event()
    read_header = hub.remote_model_info

    def held(file: hub.HubFile, token: str | None = None) -> object:
        header_wanted.set()
        assert header_may_go.wait(WAIT_MS / 1000)
        return read_header(file, token=token)

    monkeypatch.setattr(hub, "remote_model_info", held)
    dialog = open_dialog(qtbot, smollm_path, tmp_path / "models")
    dialog.set_main(dialog.main, context_size=HUGE_CONTEXT)
    search_and_pick(qtbot, dialog, "smollm2", SMOLLM_REPO, until_listed=False)
    qtbot.waitUntil(header_wanted.is_set, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: dialog.file_table.rowCount() > 0, timeout=WAIT_MS)
    assert dialog.cell(0, FITS_COLUMN) == "RAM ✓"  # its size alone, before the header
    header_may_go.set()
    qtbot.waitUntil(lambda: dialog.cell(0, VERDICT_COLUMN) != CHECKING_TEXT, timeout=WAIT_MS)
    assert dialog.cell(0, FITS_COLUMN) == "RAM ✗"
    assert dialog.cell(0, VERDICT_COLUMN).startswith("can draft: same tokenizer")


def test_download_pause_mid_file_and_resume_from_there(
    qtbot: QtBot, standin: HubStandin, smollm_path: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    dialog = open_dialog(qtbot, None, models)
    search_and_pick(qtbot, dialog, "smollm2", SMOLLM_REPO)
    dialog.file_table.selectRow(0)
    standin.chunk_delay_seconds = 0.002  # a slow link: the pause lands mid-file
    QTest.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    assert dialog.pause_button.isEnabled()
    qtbot.waitUntil(lambda: dialog.progress.value() > PROGRESS_STEPS // 20, timeout=WAIT_MS)
    QTest.mouseClick(dialog.pause_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dialog.busy(), timeout=WAIT_MS)
    assert dialog.status_text().startswith("Paused:"), dialog.status_text()
    assert dialog.download_button.text() == RESUME_TEXT
    standin.reset_faults()
    standin.clear_log()
    with qtbot.waitSignal(dialog.model_downloaded, timeout=WAIT_MS) as downloaded:
        QTest.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    # The paused GET may end on the server after the log was cleared: the ranged one.
    (resumed,) = [get for get in standin.file_gets() if get.range and get.body_bytes]
    assert resumed.range is not None
    assert int(resumed.range.removeprefix("bytes=").rstrip("-")) > 0
    path = Path(downloaded.args[0])
    assert path == hub.repo_download_dir(models, SMOLLM_REPO) / smollm_path.name
    assert hub.file_sha256(path) == standin.blob(SMOLLM_REPO, smollm_path.name).sha256
    assert dialog.progress.value() == PROGRESS_STEPS
    assert dialog.status_text().startswith("Downloaded and checked")
    assert dialog.download_button.text() == "Download"


def test_a_lost_connection_is_one_line_and_download_again_resumes(
    qtbot: QtBot,
    standin: HubStandin,
    smollm_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    instant_client_retries(monkeypatch)
    models = tmp_path / "models"
    dialog = open_dialog(qtbot, None, models)
    search_and_pick(qtbot, dialog, "smollm2", SMOLLM_REPO)
    dialog.file_table.selectRow(0)
    standin.cut_after_bytes = 30 << 20
    QTest.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dialog.busy(), timeout=WAIT_MS)
    status = dialog.status_text()
    assert status.startswith("downloading hf.co/HuggingFaceTB/"), status
    assert "\n" not in status
    standin.reset_faults()
    standin.clear_log()
    with qtbot.waitSignal(dialog.model_downloaded, timeout=WAIT_MS):
        QTest.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    # The paused GET may end on the server after the log was cleared: the ranged one.
    (resumed,) = [get for get in standin.file_gets() if get.range and get.body_bytes]
    assert resumed.range is not None
    assert resumed.range != "bytes=0-"


def test_a_gated_repo_asks_for_a_token_and_login_opens_it(
    qtbot: QtBot, standin: HubStandin, smollm_path: Path, tmp_path: Path
) -> None:
    dialog = open_dialog(qtbot, smollm_path, tmp_path / "models")
    search_and_pick(qtbot, dialog, "gated", GATED_REPO)
    qtbot.waitUntil(lambda: dialog.cell(0, VERDICT_COLUMN) != CHECKING_TEXT, timeout=WAIT_MS)
    assert "gated; accept its terms on the hub and log in" in dialog.cell(0, VERDICT_COLUMN)
    qtbot.waitUntil(lambda: not dialog.busy(), timeout=WAIT_MS)  # the listing's end said
    dialog.token_edit.setText("hf_wrong")
    QTest.mouseClick(dialog.login_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dialog.busy(), timeout=WAIT_MS)
    assert dialog.status_text().startswith("logging in: the hub answered HTTP 401"), (
        dialog.status_text()
    )
    dialog.token_edit.setText(TOKEN)
    QTest.mouseClick(dialog.login_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.status_text().startswith("Logged in"), timeout=WAIT_MS)
    from huggingface_hub import get_token

    assert get_token() == TOKEN  # kept by huggingface_hub's own token storage
    dialog.repo_list.setCurrentRow(-1)
    dialog.repo_list.setCurrentRow(dialog.repo_ids().index(GATED_REPO))
    qtbot.waitUntil(lambda: dialog.cell(0, VERDICT_COLUMN).startswith("can draft"), timeout=WAIT_MS)


def test_no_network_is_one_line_in_the_dialog(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    dialog = open_dialog(qtbot, None, tmp_path / "models")
    dialog.query_edit.setText("qwen")
    QTest.mouseClick(dialog.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dialog.busy() and "cannot reach" in dialog.status_text())
    assert dialog.status_text().startswith(
        "searching the hub for 'qwen': cannot reach http://127.0.0.1:9 ("
    ), dialog.status_text()


def test_the_sidebar_opens_it_for_the_main_model_picked(qtbot: QtBot) -> None:
    window = MainWindow(AppSettings(), offer_first_run=False)
    qtbot.addWidget(window)
    button = window.sidebar.findChild(type(window.send_button), "downloadModelsButton")
    assert button is not None
    with qtbot.waitSignal(window.sidebar.download_requested):
        button.click()
    dialog = window.hub_dialog
    assert dialog is not None
    assert dialog.isVisible()
    assert dialog.main is window.sidebar.selected_main()
    dialog.reject()
    assert window.open_hub_dialog() is dialog  # one dialog, shown again


@pytest.mark.heavy
def test_mlx_repos_are_listed_as_folders_with_their_verdict(
    qtbot: QtBot,
    tiny_mlx_main: Path,
    tiny_mlx_draft: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from backends.models.mlx_info import read_mlx_model_info

    files = {path.name: path for path in tiny_mlx_draft.iterdir()}
    repo = HubRepo("mlx-community/tiny-draft-4bit", files, tags=("mlx",), library_name="mlx")
    with serve_hub(repo) as running:
        point_client_at(running, tmp_path / "hf-home", monkeypatch)
        dialog = HubDialog(read_mlx_model_info(tiny_mlx_main), tmp_path / "models")
        qtbot.addWidget(dialog)
        dialog.engine_combo.setCurrentIndex(dialog.engine_combo.findData("mlx"))
        search_and_pick(qtbot, dialog, "tiny", repo.repo_id)
        assert dialog.cell(0, 0) == "tiny-draft-4bit"
        assert dialog.cell(0, 1) == "MLX 4-bit"
        qtbot.waitUntil(lambda: dialog.cell(0, VERDICT_COLUMN) != CHECKING_TEXT, timeout=WAIT_MS)
        assert dialog.cell(0, VERDICT_COLUMN).startswith("can draft"), dialog.cell(0, 4)
        dialog.file_table.selectRow(0)
        with qtbot.waitSignal(dialog.model_downloaded, timeout=WAIT_MS) as downloaded:
            QTest.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
        assert Path(downloaded.args[0]) == (
            tmp_path / "models" / "mlx" / "mlx-community--tiny-draft-4bit"
        )


def test_suggestions_use_the_loaded_main_models_measured_batch_costs(
    qtbot: QtBot, smollm_path: Path
) -> None:
    settings = smollm_pair_settings(smollm_path, max_tokens=8)
    settings.set("speculation_method", "auto")
    settings.set("context_size", 512)
    window = MainWindow(settings, offer_first_run=False)
    qtbot.addWidget(window)
    window.show()
    try:
        with engine_wait(qtbot, window.client, window.models_loaded, 120_000):
            window.load_when_scanned()
        dialog = window.open_hub_dialog()
        assert dialog.main is not None
        assert dialog.main.path == smollm_path
        assert dialog.main_costs is not None  # auto's calibration, from the engine process
        assert dialog.main_costs.cost(1) > 0
        assert loaded_seconds(window) == dict(dialog.main_costs.seconds)
    finally:
        window.shutdown()


def loaded_seconds(window: MainWindow) -> dict[int, float]:
    assert window.loaded is not None
    return dict(window.loaded.main_batch_seconds)


def test_a_full_disk_is_one_line_in_the_dialog(
    qtbot: QtBot, standin: HubStandin, smollm_path: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    dialog = open_dialog(qtbot, None, models)
    search_and_pick(qtbot, dialog, "smollm2", SMOLLM_REPO)
    dialog.file_table.selectRow(0)
    file = dialog.chosen_file()
    assert file is not None
    part = hub.repo_download_dir(models, SMOLLM_REPO) / (file.filename + ".part")
    part.parent.mkdir(parents=True)
    part.symlink_to("/dev/full")  # every write fails with ENOSPC, as on a full disk
    QTest.mouseClick(dialog.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "the disk is full" in dialog.status_text(), timeout=WAIT_MS)
    assert (
        dialog.status_text() == f"downloading hf.co/{SMOLLM_REPO}/{file.filename}: the disk is full"
    )
