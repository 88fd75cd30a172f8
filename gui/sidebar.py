"""The model sidebar: the models panel, the load panel and the settings form, and load state.

It decides what a load asks for (one line when the choice is impossible) and what the Load
button does; the panels show and pick.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from backends.errors import SettingsError
from gui.form_widgets import Section
from gui.load_panel import LoadPanel
from gui.models_panel import (
    MLX_UNAVAILABLE_TOOLTIP,
    NGRAM_TITLE,
    OFF_TITLE,
    TUNE_TOOLTIP,
    ModelsPanel,
    format_file_size,
    mlx_available,
    model_card_html,
)
from gui.presets import PresetBar
from gui.server_panel import ServerPanel
from gui.settings import DRAFT_CHOICE_NGRAM, DRAFT_CHOICE_OFF
from gui.settings_form import SettingsForm, show_setting
from gui.settings_to_backends import load_request_for, speculation_method
from gui.theme import keep_styled

if TYPE_CHECKING:
    from PySide6.QtGui import QHideEvent

    from backends.engines.interface import LoadReport
    from backends.models.catalog import CatalogScan
    from backends.models.draft_verdict import DraftVerdict
    from backends.models.gguf_info import ModelInfo
    from backends.service.protocol import LoadRequest
    from backends.speculation.methods import SpeculationMethod
    from gui.settings import AppSettings
    from gui.style import Colours

logger = logging.getLogger(__name__)

SIDEBAR_MIN_WIDTH = 280
CONTENT_MARGIN = 12
SECTION_SPACING = 10

CARD_RADIUS_PX = 6


def _card_styles(chosen: Colours) -> str:
    return (
        f"QLabel#modelCard {{ background: {chosen.card_background.name()};"
        f" border: 1px solid {chosen.card_border.name()}; border-radius: {CARD_RADIUS_PX}px;"
        f" padding: 6px; }}"
        f" QLabel#errorLabel {{ color: {chosen.error_text.name()};"
        f" background: {chosen.error_background.name()}; border-radius: {CARD_RADIUS_PX}px;"
        f" padding: 6px; }}"
    )


DRAFT_MODEL_NEEDS_DRAFT = "Draft model only needs a draft model"
NO_MAIN_MODEL = "Pick a main model first (or get the default pair)"

# Settings that change what a load asks for (and so the memory a pair needs).
PAIR_SETTINGS = frozenset(
    {
        "engine",
        "speculation_method",
        "context_size",
        "weight_repacking",
        "workers",
        "layer_split",
        "draft_weights",
    }
)

LoadState = Literal["unloaded", "loading", "loaded"]
ButtonAction = Literal["load", "unload"]


class Sidebar(QWidget):
    """Pick the engine and the model pair, load or unload it, and edit the settings.

    The sidebar never loads models: it asks, and the main window reports back with
    ``set_loading``, ``set_load_progress``, ``set_loaded``/``set_unloaded`` and ``show_error``.

    Signals:
        load_requested(object): Load was pressed; the argument is the LoadRequest.
        unload_requested(): Unload was pressed.
        open_folder_requested(): the user wants to see the models folder.
        download_requested(): the user wants models from the Hugging Face hub.
        fetch_default_pair_requested(): the user wants the default model pair downloaded.
        pair_changed(): the selected engine, main model, draft or method changed.
        tune_requested(): "Find my fastest setup…" was pressed (a pair is loaded).
    """

    load_requested = Signal(object)
    unload_requested = Signal()
    open_folder_requested = Signal()
    download_requested = Signal()
    fetch_default_pair_requested = Signal()
    pair_changed = Signal()
    tune_requested = Signal()

    def __init__(self, settings: AppSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._settings = settings
        self._state: LoadState = "unloaded"
        self._busy = False
        self._button_action: ButtonAction = "load"
        self._requested: LoadRequest | None = None
        self._loaded_request: LoadRequest | None = None
        self._pair_problem: str | None = None

        self.setMinimumWidth(SIDEBAR_MIN_WIDTH)
        content = QWidget()
        content.setObjectName("sidebarContent")
        layout = QVBoxLayout(content)
        layout.setContentsMargins(CONTENT_MARGIN, CONTENT_MARGIN, CONTENT_MARGIN, CONTENT_MARGIN)
        layout.setSpacing(SECTION_SPACING)
        self._models_panel = ModelsPanel(
            settings, self._write_setting, content, mlx_ok=mlx_available()
        )
        self._models_panel.selection_changed.connect(self._on_selection_changed)
        self._models_panel.open_folder_requested.connect(self.open_folder_requested)
        self._models_panel.download_requested.connect(self.download_requested)
        self._models_panel.fetch_default_pair_requested.connect(self.fetch_default_pair_requested)
        self._models_panel.tune_requested.connect(self.tune_requested)
        layout.addWidget(self._models_panel)
        self._load_panel = LoadPanel(content)
        self._load_panel.clicked.connect(self._on_load_clicked)
        layout.addWidget(self._load_panel)
        self.server_panel = ServerPanel(content)
        layout.addWidget(Section("Local server", self.server_panel, content))
        self.presets = PresetBar(settings, content)
        layout.addWidget(Section("Presets", self.presets, content))
        self._settings_form = SettingsForm(settings, content)
        self._settings_form.write_failed.connect(self.show_error)
        layout.addWidget(self._settings_form)
        layout.addStretch(1)

        scroll = QScrollArea(self)
        scroll.setWidget(content)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)

        keep_styled(self, _card_styles)
        settings.changed.connect(self._on_setting_changed)
        self._on_selection_changed(False)

    # -- building --------------------------------------------------------------------------

    # -- public API ------------------------------------------------------------------------

    def set_catalog(self, scan: CatalogScan) -> None:
        """Fill the pickers from a scan and select the remembered (or a sensible) pair."""
        self._models_panel.set_catalog(scan)

    def selected_main(self) -> ModelInfo | None:
        """The main model picked, or None when the catalog is empty."""
        return self._models_panel.selected_main()

    def selected_draft(self) -> ModelInfo | None:
        """The draft model picked, or None for n-gram lookup, Off, or an empty catalog."""
        return self._models_panel.selected_draft()

    def selected_draft_choice(self) -> str:
        """The draft picker's choice: a model path, DRAFT_CHOICE_NGRAM, or DRAFT_CHOICE_OFF."""
        return self._models_panel.selected_draft_choice()

    def load_request(self) -> LoadRequest:
        """What Load would ask for; SettingsError with a one-line message when it is impossible."""
        main = self.selected_main()
        if main is None:
            raise SettingsError(NO_MAIN_MODEL)
        choice = self.selected_draft_choice()
        method = speculation_method(self._settings)
        draft_path: str | None = None
        if choice == DRAFT_CHOICE_OFF:
            method = "off"
        elif choice == DRAFT_CHOICE_NGRAM:
            if method == "draft-model":
                raise SettingsError(DRAFT_MODEL_NEEDS_DRAFT)
        elif self._models_panel.model_at(choice) is not None:
            draft_path = choice
        else:
            raise SettingsError("Pick a draft model, n-gram lookup or Off")
        return load_request_for(
            self._settings,
            main.path,
            draft_path,
            method,
            engine=self._models_panel.selected_engine(),
        )

    def set_tuning_hint(self, text: str) -> None:
        """The line under the draft picker saying what was measured fastest ("" hides it)."""
        hint = self._models_panel.tuning_hint
        hint.setText(text)
        hint.setVisible(bool(text))

    def draft_verdicts(
        self, main: ModelInfo | None = None, *, main_loaded: bool = False
    ) -> list[DraftVerdict]:
        """Every local model's verdict as a draft for ``main`` (the selected main model)."""
        return self._models_panel.draft_verdicts(main, main_loaded=main_loaded)

    def catalog_model(self, path: str) -> ModelInfo | None:
        """The scanned model at ``path``, of either format (None when the scan has none)."""
        return self._models_panel.catalog_model(path)

    def apply_setup(self, method: SpeculationMethod, draft_path: str | None) -> None:
        """Pick a measured setup (its draft and method) and load it."""
        self._models_panel.select_setup(method, draft_path)
        if self._button_action == "load":
            self._on_load_clicked()

    def setting_widget(self, key: str) -> QWidget:
        """The editor bound to setting ``key`` (KeyError when the sidebar does not show it)."""
        if key == "engine":
            return self._models_panel.engine_combo
        if key == "speculation_method":
            return self._models_panel.method_combo
        return self._settings_form.editors[key]

    def set_loading(self, active: bool, request: LoadRequest | None = None) -> None:
        """Show (or end) a load in progress; the pickers are locked while it runs.

        ``request``: what is being loaded, when the load did not come from Load (the
        start-up load, Reload after a crash), so that a later change of the pickers
        offers Reload.
        """
        if active:
            if request is not None:
                self._requested = request
            self._state = "loading"
            self._pair_problem = None
            self._load_panel.show_loading()
        else:
            if self._state == "loading":
                self._state = "unloaded"
            self._load_panel.hide_progress()
        self._update_controls()

    def set_load_progress(self, fraction: float, message: str) -> None:
        """Move the progress bar to ``fraction`` (0..1; negative: busy without a fraction)."""
        self._load_panel.show_progress(fraction, message)

    def set_loaded(
        self,
        main: LoadReport,
        draft: LoadReport | None,
        seconds: float | None = None,
        *,
        extra_notes: tuple[str, ...] = (),
    ) -> None:
        """Show the loaded pair, how long the load took, where its layers went and why."""
        self._state = "loaded"
        self._loaded_request = self._requested
        self._pair_problem = None
        placement = [f"Main: {main.placement}"]
        if draft is not None:
            placement.append(f"Draft: {draft.placement}")
        notes = [*extra_notes, *main.notes, *(draft.notes if draft is not None else ())]
        if seconds is None:
            seconds = main.load_seconds + (draft.load_seconds if draft is not None else 0.0)
        tooltip = [f"{main.model_name}: {main.n_ctx:,}-token context, {main.n_threads} threads"]
        if draft is not None:
            tooltip.append(f"{draft.model_name}: {draft.n_ctx:,}-token context (draft)")
        self._load_panel.show_loaded(seconds, placement, notes, "\n".join(tooltip))
        self._update_controls()

    def set_unloaded(self) -> None:
        """Back to nothing loaded."""
        self._state = "unloaded"
        self._loaded_request = None
        self._load_panel.show_unloaded()
        self._update_controls()

    def show_error(self, message: str) -> None:
        """Show ``message`` in red under the Load button until the next load or selection."""
        self._load_panel.show_error(message)

    def clear_error(self) -> None:
        """Hide the error message."""
        self._pair_problem = None
        self._load_panel.clear_error()

    def error_text(self) -> str:
        """The error shown, or "" when none is."""
        return self._load_panel.error_text()

    def placement_text(self) -> str:
        """The placement lines shown after a load, or "" when nothing is loaded."""
        return self._load_panel.placement_text()

    def flush_pending_edits(self) -> None:
        """Save text still waiting for typing to pause (before quitting or answering)."""
        self._settings_form.flush_pending_edits()

    def hideEvent(self, event: QHideEvent) -> None:  # noqa: N802 (Qt's name)
        """Save pending edits when the window closes or the sidebar is folded away."""
        self.flush_pending_edits()
        super().hideEvent(event)

    def set_busy(self, generating: bool) -> None:
        """Lock the engine, the pair and Load/Unload while an answer is being generated."""
        self._busy = generating
        self._update_controls()

    # -- slots -----------------------------------------------------------------------------

    def _on_load_clicked(self) -> None:
        if self._button_action == "unload":
            self.unload_requested.emit()
            return
        try:
            request = self.load_request()
        except SettingsError as error:
            self.show_error(str(error))
            return
        self.clear_error()
        self._requested = request
        self.load_requested.emit(request)

    def _on_setting_changed(self, key: str) -> None:
        """Follow a setting changed elsewhere; re-check the pair when it changes the load."""
        panel = self._models_panel
        combo = {"engine": panel.engine_combo, "speculation_method": panel.method_combo}.get(key)
        if combo is not None:
            if combo.currentData() == self._settings.get_str(key):
                return  # the combo itself made the change and has announced it
            show_setting(combo, self._settings, key)
        if key in PAIR_SETTINGS:
            self._on_selection_changed()

    # -- helpers ---------------------------------------------------------------------------

    def _write_setting(self, key: str, value: str | int | float | bool) -> None:
        self._settings_form.write(key, value)

    def _on_selection_changed(self, clear_errors: bool = True) -> None:
        self._update_pair_problem(clear_errors=clear_errors)
        self._update_controls()
        self.pair_changed.emit()

    def _update_pair_problem(self, *, clear_errors: bool) -> None:
        """Say at once when the method and draft cannot go together; hide it once they can.

        Any other error (a failed load) goes too when ``clear_errors``: the user has changed
        what a load would do.
        """
        problem: str | None = None
        if self.selected_main() is not None:
            try:
                self.load_request()
            except SettingsError as error:
                problem = str(error)
        if problem is not None:
            self.show_error(problem)
            self._pair_problem = problem
        elif clear_errors or self._pair_problem is not None:
            self.clear_error()

    def _update_controls(self) -> None:
        has_models = self._models_panel.has_models
        self._models_panel.set_pickers_enabled(not self._busy and self._state != "loading")
        tune = self._models_panel.tune_button
        tune.setEnabled(self._state == "loaded" and not self._busy)
        tune.setToolTip(
            TUNE_TOOLTIP if self._state == "loaded" else f"Load a main model first. {TUNE_TOOLTIP}"
        )
        panel = self._load_panel
        if self._state == "loading":
            self._button_action = "load"
            panel.set_button("Loading…", panel.button.toolTip(), enabled=False)
            return
        if self._state == "loaded" and not self._selection_differs_from_loaded():
            self._button_action = "unload"
            tooltip = "Free the memory the loaded models hold"
            panel.set_button("Unload", tooltip, enabled=not self._busy)
            return
        self._button_action = "load"
        if self._state == "loaded":
            text, tooltip = (
                "Reload",
                "Load the selected pair with these settings in place of the loaded one",
            )
        else:
            text, tooltip = "Load", "Load the selected models"
        panel.set_button(text, tooltip, enabled=not self._busy and has_models)

    def _selection_differs_from_loaded(self) -> bool:
        if self._loaded_request is None:
            return False
        try:
            return self.load_request() != self._loaded_request
        except SettingsError:
            return True


__all__ = [
    "DRAFT_MODEL_NEEDS_DRAFT",
    "MLX_UNAVAILABLE_TOOLTIP",
    "NGRAM_TITLE",
    "OFF_TITLE",
    "Sidebar",
    "format_file_size",
    "mlx_available",
    "model_card_html",
]
