"""Tests of the model sidebar with a real catalog of GGUF files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItemModel
from PySide6.QtTest import QTest
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
)

import gui.sidebar as sidebar_module
from backends.engines.interface import LoadReport
from backends.errors import SettingsError
from backends.models.catalog import CatalogScan, ScanProblem, read_catalog_model, scan_models
from backends.paths import models_dir
from backends.service.protocol import LoadRequest
from gui.settings import DRAFT_CHOICE_NGRAM, DRAFT_CHOICE_OFF, SETTINGS, AppSettings
from gui.sidebar import (
    DRAFT_MODEL_NEEDS_DRAFT,
    MLX_UNAVAILABLE_TOOLTIP,
    NGRAM_TITLE,
    OFF_TITLE,
    Sidebar,
    format_file_size,
)

if TYPE_CHECKING:
    from pytestqt.qtbot import QtBot

FORM_KEYS = (
    "draft_max",
    "p_min",
    "exact_verification",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_tokens",
    "context_size",
    "system_prompt",
    "structured_output",
    "json_schema",
    "visualize_drafts",
    "compare",
)
MAIN_REPORT = LoadReport(
    model_name="Qwen2.5 Coder 1.5B Instruct",
    backend="CPU",
    n_layers=28,
    gpu_layers=0,
    kv_cache_on_gpu=False,
    n_ctx=4096,
    n_threads=2,
    load_seconds=1.5,
)
DRAFT_REPORT = LoadReport(
    model_name="Qwen2.5 Coder 0.5B Instruct",
    backend="Metal",
    n_layers=24,
    gpu_layers=24,
    kv_cache_on_gpu=True,
    n_ctx=4096,
    n_threads=2,
    load_seconds=0.5,
)


@pytest.fixture(scope="session")
def real_scan(
    qwen_main_path: Path, qwen_draft_path: Path, gemma_path: Path, smollm_path: Path
) -> CatalogScan:
    """The real models folder, holding at least the four test models."""
    scan = scan_models([models_dir()])
    paths = {info.path for info in scan.models}
    assert {qwen_main_path, qwen_draft_path, gemma_path, smollm_path} <= paths
    return scan


@pytest.fixture
def settings() -> AppSettings:
    return AppSettings()


@pytest.fixture
def sidebar(qtbot: QtBot, settings: AppSettings, real_scan: CatalogScan) -> Sidebar:
    widget = Sidebar(settings)
    qtbot.addWidget(widget)
    widget.set_catalog(real_scan)
    widget.resize(320, 800)
    widget.show()
    return widget


def combo(sidebar: Sidebar, name: str) -> QComboBox:
    found = sidebar.findChild(QComboBox, name)
    assert found is not None, name
    return found


def button(sidebar: Sidebar, name: str) -> QPushButton:
    found = sidebar.findChild(QPushButton, name)
    assert found is not None, name
    return found


def pick(picker: QComboBox, data: str | Path) -> None:
    """Select an entry as the user would (the index changes, so the combo's signals fire)."""
    index = picker.findData(str(data))
    assert index >= 0, f"{data} not offered"
    picker.setCurrentIndex(index)


def draft_row(sidebar: Sidebar, data: str | Path) -> int:
    index = combo(sidebar, "draftPicker").findData(str(data))
    assert index >= 0, f"{data} not in the draft list"
    return index


def draft_enabled(sidebar: Sidebar, data: str | Path) -> bool:
    model = combo(sidebar, "draftPicker").model()
    assert isinstance(model, QStandardItemModel)
    item = model.item(draft_row(sidebar, data))
    return item.isEnabled()


def draft_tooltip(sidebar: Sidebar, data: str | Path) -> str:
    picker = combo(sidebar, "draftPicker")
    tooltip = picker.itemData(draft_row(sidebar, data), Qt.ItemDataRole.ToolTipRole)
    return str(tooltip)


@pytest.mark.default_pair
def test_the_default_pair_is_selected_first(
    sidebar: Sidebar, qwen_main_path: Path, qwen_draft_path: Path
) -> None:
    main = sidebar.selected_main()
    draft = sidebar.selected_draft()
    assert main is not None
    assert main.path == qwen_main_path
    assert draft is not None
    assert draft.path == qwen_draft_path


@pytest.mark.default_pair
def test_drafts_are_filtered_by_compatibility(
    sidebar: Sidebar,
    qwen_main_path: Path,
    qwen_draft_path: Path,
    gemma_path: Path,
    smollm_path: Path,
) -> None:
    pick(combo(sidebar, "mainPicker"), qwen_main_path)
    assert draft_enabled(sidebar, qwen_draft_path)
    assert draft_enabled(sidebar, qwen_main_path)  # self-speculation is allowed
    assert not draft_enabled(sidebar, gemma_path)
    assert draft_tooltip(sidebar, gemma_path).startswith("cannot draft: another family (gemma3")
    assert "tokenizer" in draft_tooltip(sidebar, gemma_path)
    assert not draft_enabled(sidebar, smollm_path)
    assert "vocabularies differ" in draft_tooltip(sidebar, smollm_path)

    picker = combo(sidebar, "draftPicker")
    assert picker.itemText(draft_row(sidebar, DRAFT_CHOICE_NGRAM)) == NGRAM_TITLE
    assert picker.itemText(draft_row(sidebar, DRAFT_CHOICE_OFF)) == OFF_TITLE
    assert draft_enabled(sidebar, DRAFT_CHOICE_NGRAM)
    assert draft_enabled(sidebar, DRAFT_CHOICE_OFF)


@pytest.mark.default_pair
def test_a_main_without_compatible_drafts_falls_back_to_ngram(
    sidebar: Sidebar, smollm_path: Path, qwen_draft_path: Path
) -> None:
    pick(combo(sidebar, "mainPicker"), smollm_path)
    assert sidebar.selected_draft_choice() == DRAFT_CHOICE_NGRAM
    assert not draft_enabled(sidebar, qwen_draft_path)
    assert draft_enabled(sidebar, smollm_path)


@pytest.mark.default_pair
def test_model_cards_show_the_facts(sidebar: Sidebar, qwen_main_path: Path) -> None:
    main = sidebar.selected_main()
    draft = sidebar.selected_draft()
    assert main is not None
    assert draft is not None
    cards = [label.text() for label in sidebar.findChildren(QLabel, "modelCard")]
    main_card = next(text for text in cards if "1.5B" in text)
    for fact in (
        "Qwen2.5 Coder 1.5B Instruct",
        "1.5B parameters",
        "Q4_K_M",
        format_file_size(main.file_size),
        "32,768-token context",
        "28 layers",
    ):
        assert fact in main_card
    draft_card = next(text for text in cards if "0.5B" in text)
    assert "24 layers" in draft_card
    assert format_file_size(draft.file_size) == "491 MB"
    assert format_file_size(main.file_size) == "1.12 GB"


@pytest.mark.parametrize(
    ("method", "draft_choice", "expected_method", "uses_draft"),
    [
        ("auto", "model", "auto", True),
        ("draft-model", "model", "draft-model", True),
        ("ngram-simple", "model", "ngram-simple", True),
        ("auto", DRAFT_CHOICE_NGRAM, "auto", False),
        ("ngram-mod", DRAFT_CHOICE_NGRAM, "ngram-mod", False),
        ("auto", DRAFT_CHOICE_OFF, "off", False),
        ("draft-model", DRAFT_CHOICE_OFF, "off", False),
    ],
)
@pytest.mark.default_pair
def test_load_request_maps_the_choices(
    sidebar: Sidebar,
    qwen_main_path: Path,
    qwen_draft_path: Path,
    method: str,
    draft_choice: str,
    expected_method: str,
    uses_draft: bool,
) -> None:
    pick(combo(sidebar, "methodPicker"), method)
    pick(
        combo(sidebar, "draftPicker"),
        qwen_draft_path if draft_choice == "model" else draft_choice,
    )
    request = sidebar.load_request()
    assert request == LoadRequest(
        main_path=str(qwen_main_path),
        draft_path=str(qwen_draft_path) if uses_draft else None,
        engine="llama.cpp",
        method=expected_method,  # type: ignore[arg-type]
        n_ctx=4096,
    )


@pytest.mark.default_pair
def test_draft_model_mode_without_a_draft_is_an_inline_error(
    sidebar: Sidebar, qtbot: QtBot
) -> None:
    pick(combo(sidebar, "methodPicker"), "draft-model")
    pick(combo(sidebar, "draftPicker"), DRAFT_CHOICE_NGRAM)
    with pytest.raises(SettingsError, match=DRAFT_MODEL_NEEDS_DRAFT):
        sidebar.load_request()
    assert sidebar.error_text() == DRAFT_MODEL_NEEDS_DRAFT

    with qtbot.assertNotEmitted(sidebar.load_requested):
        QTest.mouseClick(button(sidebar, "loadButton"), Qt.MouseButton.LeftButton)
    assert sidebar.error_text() == DRAFT_MODEL_NEEDS_DRAFT

    pick(combo(sidebar, "methodPicker"), "auto")
    assert sidebar.error_text() == ""


@pytest.mark.default_pair
def test_pressing_load_emits_the_selected_request(
    sidebar: Sidebar, qtbot: QtBot, settings: AppSettings, smollm_path: Path
) -> None:
    settings.set("context_size", 2048)
    pick(combo(sidebar, "mainPicker"), smollm_path)
    pick(combo(sidebar, "draftPicker"), smollm_path)
    pick(combo(sidebar, "methodPicker"), "draft-model")
    with qtbot.waitSignal(sidebar.load_requested) as blocker:
        QTest.mouseClick(button(sidebar, "loadButton"), Qt.MouseButton.LeftButton)
    assert blocker.args == [
        LoadRequest(
            main_path=str(smollm_path),
            draft_path=str(smollm_path),
            engine="llama.cpp",
            method="draft-model",
            n_ctx=2048,
        )
    ]


@pytest.mark.default_pair
def test_selection_is_remembered(
    qtbot: QtBot,
    sidebar: Sidebar,
    settings: AppSettings,
    real_scan: CatalogScan,
    smollm_path: Path,
) -> None:
    pick(combo(sidebar, "mainPicker"), smollm_path)
    pick(combo(sidebar, "draftPicker"), DRAFT_CHOICE_OFF)
    assert settings.get("last_main_path") == str(smollm_path)
    assert settings.get("last_draft_choice") == DRAFT_CHOICE_OFF

    reopened = Sidebar(AppSettings(settings.path))
    qtbot.addWidget(reopened)
    reopened.set_catalog(real_scan)
    main = reopened.selected_main()
    assert main is not None
    assert main.path == smollm_path
    assert reopened.selected_draft_choice() == DRAFT_CHOICE_OFF
    assert reopened.load_request().method == "off"


@pytest.mark.default_pair
def test_an_incompatible_remembered_draft_is_replaced(
    qtbot: QtBot,
    settings: AppSettings,
    real_scan: CatalogScan,
    qwen_main_path: Path,
    qwen_draft_path: Path,
    gemma_path: Path,
) -> None:
    settings.set("last_main_path", str(qwen_main_path))
    settings.set("last_draft_choice", str(gemma_path))
    widget = Sidebar(settings)
    qtbot.addWidget(widget)
    widget.set_catalog(real_scan)
    draft = widget.selected_draft()
    assert draft is not None
    assert draft.path == qwen_draft_path


@pytest.mark.default_pair
def test_pair_changed_is_emitted_on_selection(
    sidebar: Sidebar, qtbot: QtBot, smollm_path: Path
) -> None:
    with qtbot.waitSignal(sidebar.pair_changed):
        pick(combo(sidebar, "mainPicker"), smollm_path)
    with qtbot.waitSignal(sidebar.pair_changed):
        pick(combo(sidebar, "draftPicker"), DRAFT_CHOICE_OFF)


@pytest.mark.default_pair
def test_settings_widgets_follow_the_declarations(sidebar: Sidebar) -> None:
    specs = {spec.key: spec for spec in SETTINGS}
    captions = {label.text(): label for label in sidebar.findChildren(QLabel)}
    for key in FORM_KEYS:
        spec = specs[key]
        widget = sidebar.setting_widget(key)
        assert widget.toolTip() == spec.tooltip, key
        if isinstance(widget, QCheckBox):
            assert widget.text() == spec.title
        else:
            assert spec.title in captions, key
            assert captions[spec.title].toolTip() == spec.tooltip
    draft_max = sidebar.setting_widget("draft_max")
    assert isinstance(draft_max, QSpinBox)
    assert (draft_max.minimum(), draft_max.maximum()) == (1, 32)
    seed = sidebar.setting_widget("seed")
    assert isinstance(seed, QSpinBox)
    assert seed.text() == "random"


@pytest.mark.default_pair
def test_settings_widgets_write_through(
    sidebar: Sidebar, settings: AppSettings, qtbot: QtBot
) -> None:
    draft_max = sidebar.setting_widget("draft_max")
    assert isinstance(draft_max, QSpinBox)
    draft_max.setValue(7)
    temperature = sidebar.setting_widget("temperature")
    assert isinstance(temperature, QDoubleSpinBox)
    temperature.setValue(0.65)
    exact = sidebar.setting_widget("exact_verification")
    assert isinstance(exact, QCheckBox)
    QTest.mouseClick(exact, Qt.MouseButton.LeftButton)
    compare = sidebar.setting_widget("compare")
    assert isinstance(compare, QCheckBox)
    QTest.mouseClick(compare, Qt.MouseButton.LeftButton)
    prompt = sidebar.setting_widget("system_prompt")
    assert isinstance(prompt, QPlainTextEdit)
    prompt.setFocus()
    QTest.keyClicks(prompt, "Be brief.")
    qtbot.waitUntil(lambda: settings.get("system_prompt") == "Be brief.")

    assert settings.get("draft_max") == 7
    assert settings.get("temperature") == pytest.approx(0.65)
    assert settings.get("exact_verification") is False
    assert settings.get("compare") is True
    persisted = AppSettings(settings.path)
    assert persisted.get("draft_max") == 7
    assert persisted.get("system_prompt") == "Be brief."
    assert persisted.get("exact_verification") is False


@pytest.mark.default_pair
def test_settings_changed_elsewhere_show_in_the_form(
    sidebar: Sidebar, settings: AppSettings
) -> None:
    settings.set("top_k", 40)
    settings.set("visualize_drafts", False)
    settings.set("system_prompt", "You are terse.")
    settings.set("speculation_method", "ngram-simple")
    top_k = sidebar.setting_widget("top_k")
    assert isinstance(top_k, QSpinBox)
    assert top_k.value() == 40
    visualize = sidebar.setting_widget("visualize_drafts")
    assert isinstance(visualize, QCheckBox)
    assert not visualize.isChecked()
    prompt = sidebar.setting_widget("system_prompt")
    assert isinstance(prompt, QPlainTextEdit)
    assert prompt.toPlainText() == "You are terse."
    assert combo(sidebar, "methodPicker").currentData() == "ngram-simple"
    assert sidebar.load_request().method == "ngram-simple"


@pytest.mark.default_pair
def test_loaded_state_shows_placement_and_offers_unload(sidebar: Sidebar, qtbot: QtBot) -> None:
    load = button(sidebar, "loadButton")
    with qtbot.waitSignal(sidebar.load_requested):
        QTest.mouseClick(load, Qt.MouseButton.LeftButton)
    sidebar.set_loading(True)
    assert not load.isEnabled()
    assert not combo(sidebar, "mainPicker").isEnabled()
    sidebar.set_load_progress(0.5, "Loading the main model")
    bar = sidebar.findChild(QProgressBar, "loadProgress")
    assert bar is not None
    assert bar.isVisible()
    assert bar.value() == bar.maximum() // 2
    message = sidebar.findChild(QLabel, "loadProgressMessage")
    assert message is not None
    assert message.text() == "Loading the main model"

    sidebar.set_loaded(MAIN_REPORT, DRAFT_REPORT, 12.34)
    sidebar.set_loading(False)
    status = sidebar.findChild(QLabel, "loadStatus")
    assert status is not None
    assert status.text() == "● Loaded in 12.3 s"  # the whole wait, not the models' share
    placement = sidebar.placement_text()
    assert "Main: CPU: all 28 layers on CPU (2 threads)" in placement
    assert "Draft: Metal: all 24 layers on GPU, KV cache on GPU" in placement
    assert not bar.isVisible()
    assert load.text() == "Unload"
    assert combo(sidebar, "mainPicker").isEnabled()
    with qtbot.waitSignal(sidebar.unload_requested):
        QTest.mouseClick(load, Qt.MouseButton.LeftButton)

    sidebar.set_unloaded()
    assert sidebar.placement_text() == ""
    assert load.text() == "Load"


@pytest.mark.default_pair
def test_changing_the_pair_after_loading_offers_reload(
    sidebar: Sidebar, qtbot: QtBot, smollm_path: Path
) -> None:
    load = button(sidebar, "loadButton")
    with qtbot.waitSignal(sidebar.load_requested):
        QTest.mouseClick(load, Qt.MouseButton.LeftButton)
    sidebar.set_loaded(MAIN_REPORT, None)
    assert load.text() == "Unload"
    pick(combo(sidebar, "mainPicker"), smollm_path)
    assert load.text() == "Reload"
    with qtbot.waitSignal(sidebar.load_requested) as blocker:
        QTest.mouseClick(load, Qt.MouseButton.LeftButton)
    request = blocker.args[0]
    assert isinstance(request, LoadRequest)
    assert request.main_path == str(smollm_path)


@pytest.mark.default_pair
def test_busy_locks_the_model_choice(sidebar: Sidebar) -> None:
    sidebar.set_busy(True)
    for name in ("enginePicker", "mainPicker", "draftPicker", "methodPicker"):
        assert not combo(sidebar, name).isEnabled(), name
    assert not button(sidebar, "loadButton").isEnabled()
    assert sidebar.setting_widget("temperature").isEnabled()
    sidebar.set_busy(False)
    for name in ("enginePicker", "mainPicker", "draftPicker", "methodPicker"):
        assert combo(sidebar, name).isEnabled(), name
    assert button(sidebar, "loadButton").isEnabled()


@pytest.mark.default_pair
def test_show_error_shows_the_message(sidebar: Sidebar, smollm_path: Path) -> None:
    message = "not enough memory for the main model: needs 3.1 GB, 1.2 GB free"
    sidebar.show_error(message)
    assert sidebar.error_text() == message
    error_labels = [label for label in sidebar.findChildren(QLabel) if label.text() == message]
    assert len(error_labels) == 1
    assert error_labels[0].isVisible()
    assert error_labels[0].wordWrap()
    pick(combo(sidebar, "mainPicker"), smollm_path)
    assert sidebar.error_text() == ""


@pytest.mark.default_pair
def test_scan_problems_are_summarised(sidebar: Sidebar, real_scan: CatalogScan) -> None:
    problems = (
        ScanProblem(Path("/models/broken.gguf"), "truncated file: 12 bytes of 4096"),
        ScanProblem(Path("/models/old.bin.gguf"), "GGML format, no longer loadable"),
    )
    sidebar.set_catalog(CatalogScan(real_scan.models, problems))
    label = sidebar.findChild(QLabel, "problemsLabel")
    assert label is not None
    assert label.isVisible()
    assert label.text() == "2 files could not be read"
    assert "truncated file" in label.toolTip()
    assert "old.bin.gguf" in label.toolTip()
    sidebar.set_catalog(real_scan)
    assert not label.isVisible()


@pytest.mark.default_pair
def test_an_empty_catalog_offers_the_default_pair(sidebar: Sidebar, qtbot: QtBot) -> None:
    sidebar.set_catalog(CatalogScan((), ()))
    fetch = button(sidebar, "fetchDefaultPairButton")
    assert fetch.isVisible()
    assert sidebar.selected_main() is None
    assert not button(sidebar, "loadButton").isEnabled()
    with pytest.raises(SettingsError):
        sidebar.load_request()
    with qtbot.waitSignal(sidebar.fetch_default_pair_requested):
        QTest.mouseClick(fetch, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(sidebar.open_folder_requested):
        QTest.mouseClick(button(sidebar, "openFolderButton"), Qt.MouseButton.LeftButton)


@pytest.mark.default_pair
def test_the_fetch_button_hides_when_there_are_models(sidebar: Sidebar) -> None:
    assert not button(sidebar, "fetchDefaultPairButton").isVisible()


@pytest.mark.parametrize("available", [True, False])
def test_mlx_is_offered_only_when_installed(
    qtbot: QtBot,
    settings: AppSettings,
    monkeypatch: pytest.MonkeyPatch,
    available: bool,
) -> None:
    monkeypatch.setattr(sidebar_module, "mlx_available", lambda: available)
    widget = Sidebar(settings)
    qtbot.addWidget(widget)
    engines = combo(widget, "enginePicker")
    model = engines.model()
    assert isinstance(model, QStandardItemModel)
    mlx = model.item(engines.findData("mlx"))
    assert mlx.isEnabled() is available
    assert (mlx.toolTip() == MLX_UNAVAILABLE_TOOLTIP) is not available
    assert engines.currentData() == "llama.cpp"


@pytest.mark.default_pair
def test_choosing_mlx_lists_only_mlx_folders_and_goes_into_the_request(
    qtbot: QtBot,
    settings: AppSettings,
    real_scan: CatalogScan,
    tiny_mlx_main: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sidebar_module, "mlx_available", lambda: True)
    mlx_scan = scan_models([tiny_mlx_main.parent])
    assert [info.format for info in mlx_scan.models] == ["mlx"]
    widget = Sidebar(settings)
    qtbot.addWidget(widget)
    widget.set_catalog(CatalogScan(real_scan.models + mlx_scan.models, ()))
    main_picker = combo(widget, "mainPicker")
    gguf_count = main_picker.count()
    # The user's own models folder may hold MLX imports too; they are listed only for MLX.
    real_mlx = [info for info in real_scan.models if info.format == "mlx"]
    assert gguf_count == len(real_scan.models) - len(real_mlx)
    pick(combo(widget, "enginePicker"), "mlx")
    assert settings.get("engine") == "mlx"
    assert main_picker.count() == len(real_mlx) + 1
    pick(main_picker, tiny_mlx_main)
    request = widget.load_request()
    assert request.engine == "mlx"
    assert request.main_path == str(tiny_mlx_main)
    pick(combo(widget, "enginePicker"), "llama.cpp")
    assert main_picker.count() == gguf_count


def test_an_mlx_main_offers_its_gguf_twin_as_a_draft_imported_at_load(
    qtbot: QtBot,
    settings: AppSettings,
    smollm_mlx: Path,
    smollm_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sidebar_module, "mlx_available", lambda: True)
    gguf, mlx_folder = read_catalog_model(smollm_path), read_catalog_model(smollm_mlx)
    widget = Sidebar(settings)
    qtbot.addWidget(widget)
    widget.set_catalog(CatalogScan((gguf, mlx_folder), ()))
    pick(combo(widget, "enginePicker"), "mlx")
    pick(combo(widget, "mainPicker"), smollm_mlx)
    assert draft_enabled(widget, smollm_path)
    picker = combo(widget, "draftPicker")
    assert picker.itemText(draft_row(widget, smollm_path)).endswith("· imported to MLX on load")
    pick(picker, smollm_path)
    request = widget.load_request()
    assert request.engine == "mlx"
    assert request.draft_path == str(smollm_path)  # the load imports it (open_pair)
    # For a GGUF main model the MLX folder is listed, greyed, with the reason.
    pick(combo(widget, "enginePicker"), "llama.cpp")
    pick(combo(widget, "mainPicker"), smollm_path)
    assert not draft_enabled(widget, smollm_mlx)
    tooltip = draft_tooltip(widget, smollm_mlx)
    assert tooltip.startswith("cannot draft: an MLX folder and the main model is a GGUF file")


@pytest.mark.default_pair
def test_a_pending_system_prompt_is_saved_on_hide(sidebar: Sidebar, settings: AppSettings) -> None:
    prompt = sidebar.setting_widget("system_prompt")
    assert isinstance(prompt, QPlainTextEdit)
    prompt.setFocus()
    QTest.keyClicks(prompt, "Use metric units.")
    assert settings.get("system_prompt") == ""  # saved when typing pauses, not per key
    sidebar.hide()
    assert settings.get("system_prompt") == "Use metric units."
    assert AppSettings(settings.path).get("system_prompt") == "Use metric units."


@pytest.mark.default_pair
def test_the_json_schema_box_shows_for_a_json_schema_and_saves_when_typing_pauses(
    sidebar: Sidebar, settings: AppSettings, qtbot: QtBot
) -> None:
    schema = sidebar.setting_widget("json_schema")
    assert isinstance(schema, QPlainTextEdit)
    assert not schema.isVisible()  # Structured output is off
    choice = sidebar.setting_widget("structured_output")
    assert isinstance(choice, QComboBox)
    assert [choice.itemText(i) for i in range(choice.count())] == [
        "Off",
        "Any JSON object",
        "JSON schema",
    ]
    choice.setCurrentIndex(2)
    assert settings.get("structured_output") == "json_schema"
    assert schema.isVisible()
    schema.setFocus()
    QTest.keyClicks(schema, '{"type": "object"}')
    assert settings.get("json_schema") == ""  # saved when typing pauses, not per key
    qtbot.waitUntil(lambda: settings.get("json_schema") == '{"type": "object"}')
    QTest.keyClicks(schema, " ")
    sidebar.flush_pending_edits()  # as sending a message does
    assert settings.get("json_schema") == '{"type": "object"} '
    settings.set("structured_output", "json_object")  # changed elsewhere: the box follows
    assert not schema.isVisible()
