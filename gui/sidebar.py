"""The model sidebar: engine, main and draft pickers, load state, and the settings form."""

from __future__ import annotations

import html
import importlib.util
import logging
from typing import TYPE_CHECKING, Literal

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtGui import QColor, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from backends.errors import SettingsError
from backends.models.catalog import compatible_drafts
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_source
from backends.service.protocol import ENGINE_KINDS
from gui.form_widgets import CalmComboBox, caption, heading, muted_label, select_data
from gui.load_panel import LoadPanel
from gui.settings import (
    DRAFT_CHOICE_NGRAM,
    DRAFT_CHOICE_OFF,
    load_request_for,
    setting_spec,
    speculation_method,
)
from gui.settings_form import SettingsForm, show_setting
from gui.style import ERROR_TEXT

if TYPE_CHECKING:
    from PySide6.QtGui import QHideEvent

    from backends.engines.interface import LoadReport
    from backends.models.catalog import CatalogScan
    from backends.models.gguf_info import ModelInfo
    from backends.service.protocol import EngineKind, LoadRequest
    from gui.settings import AppSettings

logger = logging.getLogger(__name__)

SIDEBAR_MIN_WIDTH = 280
CONTENT_MARGIN = 12
SECTION_SPACING = 10
ROW_SPACING = 4
COMBO_MIN_CONTENT_CHARS = 12
FLOAT_DECIMALS = 2
SYSTEM_PROMPT_LINES = 4
PROGRESS_STEPS = 1000
# A system prompt is saved when typing pauses, not on every key.
SYSTEM_PROMPT_SAVE_DELAY_MS = 400

CARD_BACKGROUND = QColor("#f7f7f8")
CARD_BORDER = QColor("#e4e4e7")
CARD_RADIUS_PX = 6
ERROR_BACKGROUND = QColor("#fef3f2")

MLX_MODULE = "mlx_lm"
MLX_UNAVAILABLE_TOOLTIP = "MLX needs Apple Silicon (or mlx[cpu])"
NGRAM_TITLE = "n-gram lookup (no draft model)"
OFF_TITLE = "Off: main model alone"
NGRAM_DESCRIPTION = (
    "Drafts by looking up text the conversation already holds; no second model to load."
)
OFF_DESCRIPTION = "No drafting: the main model answers alone, token by token."
DRAFT_MODEL_NEEDS_DRAFT = "Draft model only needs a draft model"
NO_MAIN_MODEL = "Pick a main model first (or get the default pair)"
NO_MODELS_TEXT = "No GGUF models found in SpecDeck's folder, LM Studio's or the Hugging Face cache."

# The settings form: these groups, in this order; the speculation method has its own combo
# next to the draft picker.
# Settings that change what a load asks for (and so the memory a pair needs).
PAIR_SETTINGS = frozenset({"engine", "speculation_method", "context_size", "weight_repacking"})

LoadState = Literal["unloaded", "loading", "loaded"]
ButtonAction = Literal["load", "unload"]


def mlx_available() -> bool:
    """Whether the MLX engine's package can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(MLX_MODULE) is not None
    except (ImportError, ValueError):
        return False


def format_file_size(size: int) -> str:
    """Bytes as MB below a gigabyte, GB above (decimal units, as file managers show them)."""
    if size >= 1_000_000_000:
        return f"{size / 1e9:.2f} GB"
    return f"{size / 1e6:.0f} MB"


def model_card_html(info: ModelInfo) -> str:
    """The card text of a model: name, then parameters, quantization, size, context, layers."""
    facts = [f"{info.size_label} parameters", info.quantization, format_file_size(info.file_size)]
    shape = []
    if info.context_length:
        shape.append(f"{info.context_length:,}-token context")
    if info.n_layers:
        shape.append(f"{info.n_layers} layers")
    name = info.display_name.removesuffix(f" ({info.quantization})")
    lines = [f"<b>{html.escape(name)}</b>", html.escape(" · ".join(facts))]
    if shape:
        lines.append(html.escape(" · ".join(shape)))
    return "<br>".join(lines)


class Sidebar(QWidget):
    """Pick the engine and the model pair, load or unload it, and edit the settings.

    The sidebar never loads models: it asks, and the main window reports back with
    ``set_loading``, ``set_load_progress``, ``set_loaded``/``set_unloaded`` and ``show_error``.

    Signals:
        load_requested(object): Load was pressed; the argument is the LoadRequest.
        unload_requested(): Unload was pressed.
        open_folder_requested(): the user wants to see the models folder.
        fetch_default_pair_requested(): the user wants the default model pair downloaded.
        pair_changed(): the selected engine, main model, draft or method changed.
    """

    load_requested = Signal(object)
    unload_requested = Signal()
    open_folder_requested = Signal()
    fetch_default_pair_requested = Signal()
    pair_changed = Signal()

    def __init__(self, settings: AppSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._settings = settings
        self._catalog_models: tuple[ModelInfo, ...] = ()  # every format
        self._models: tuple[ModelInfo, ...] = ()  # those the selected engine reads
        self._models_by_path: dict[str, ModelInfo] = {}
        self._state: LoadState = "unloaded"
        self._busy = False
        self._filling = False
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
        layout.addWidget(self._build_models_section())
        self._load_panel = LoadPanel(content)
        self._load_panel.clicked.connect(self._on_load_clicked)
        layout.addWidget(self._load_panel)
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

        self.setStyleSheet(
            f"QLabel#modelCard {{ background: {CARD_BACKGROUND.name()};"
            f" border: 1px solid {CARD_BORDER.name()}; border-radius: {CARD_RADIUS_PX}px;"
            f" padding: 6px; }}"
            f" QLabel#errorLabel {{ color: {ERROR_TEXT.name()};"
            f" background: {ERROR_BACKGROUND.name()}; border-radius: {CARD_RADIUS_PX}px;"
            f" padding: 6px; }}"
        )
        settings.changed.connect(self._on_setting_changed)
        self._fill_pickers(())

    # -- building --------------------------------------------------------------------------

    def _build_models_section(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(ROW_SPACING)

        layout.addWidget(heading("Models"))
        engine_spec = setting_spec("engine")
        self._engine_combo = CalmComboBox()
        self._engine_combo.setObjectName("enginePicker")
        self._engine_combo.setToolTip(engine_spec.tooltip)
        engine_model = QStandardItemModel(self._engine_combo)
        mlx_ok = mlx_available()
        for kind in ENGINE_KINDS:
            item = QStandardItem(engine_spec.title_of(kind))
            item.setData(kind, Qt.ItemDataRole.UserRole)
            if kind == "mlx" and not mlx_ok:
                item.setEnabled(False)
                item.setToolTip(MLX_UNAVAILABLE_TOOLTIP)
            engine_model.appendRow(item)
        self._engine_combo.setModel(engine_model)
        select_data(self._engine_combo, self._settings.get_str("engine"), fallback=0)
        self._engine_combo.currentIndexChanged.connect(self._on_engine_changed)
        layout.addWidget(caption("Engine", engine_spec.tooltip))
        layout.addWidget(self._engine_combo)

        self._main_combo = _make_picker()
        self._main_combo.setObjectName("mainPicker")
        self._main_combo.setPlaceholderText("No models found")
        self._main_combo.currentIndexChanged.connect(self._on_main_changed)
        layout.addWidget(caption("Main model", "The model whose answer you get."))
        layout.addWidget(self._main_combo)
        self._empty_label = muted_label(NO_MODELS_TEXT)
        layout.addWidget(self._empty_label)
        main_source, draft_source = model_source(DEFAULT_MAIN_KEY), model_source(DEFAULT_DRAFT_KEY)
        self._fetch_button = QPushButton("Get the default pair")
        self._fetch_button.setObjectName("fetchDefaultPairButton")
        self._fetch_button.setToolTip(
            f"Download {main_source.title} and {draft_source.title} "
            f"({format_file_size(main_source.size + draft_source.size)}) into SpecDeck's "
            "models folder"
        )
        self._fetch_button.clicked.connect(self.fetch_default_pair_requested)
        layout.addWidget(self._fetch_button)
        self._main_card = _card()
        layout.addWidget(self._main_card)

        self._draft_combo = _make_picker()
        self._draft_combo.setObjectName("draftPicker")
        self._draft_model = QStandardItemModel(self._draft_combo)
        self._draft_combo.setModel(self._draft_model)
        self._draft_combo.currentIndexChanged.connect(self._on_draft_changed)
        layout.addWidget(
            caption(
                "Draft",
                "A small model with the main model's tokenizer that proposes tokens for the "
                "main model to verify (llama.cpp's --model-draft).",
            )
        )
        layout.addWidget(self._draft_combo)
        self._draft_card = _card()
        layout.addWidget(self._draft_card)

        method_spec = setting_spec("speculation_method")
        self._method_combo = CalmComboBox()
        self._method_combo.setObjectName("methodPicker")
        self._method_combo.setToolTip(method_spec.tooltip)
        method_model = QStandardItemModel(self._method_combo)
        for index, choice in enumerate(method_spec.choices):
            item = QStandardItem(method_spec.title_of(choice))
            item.setData(choice, Qt.ItemDataRole.UserRole)
            if method_spec.choice_tooltips:
                item.setToolTip(method_spec.choice_tooltips[index])
            method_model.appendRow(item)
        self._method_combo.setModel(method_model)
        select_data(self._method_combo, self._settings.get_str(method_spec.key), fallback=0)
        self._method_combo.currentIndexChanged.connect(self._on_method_changed)
        layout.addWidget(caption(method_spec.title, method_spec.tooltip))
        layout.addWidget(self._method_combo)

        self._problems_label = muted_label()
        self._problems_label.setObjectName("problemsLabel")
        layout.addWidget(self._problems_label)

        self._open_folder_button = QPushButton("Open models folder…")
        self._open_folder_button.setObjectName("openFolderButton")
        self._open_folder_button.setFlat(True)
        self._open_folder_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self._open_folder_button.setToolTip("Show the folder SpecDeck looks in for GGUF files")
        self._open_folder_button.setStyleSheet(
            "text-align: left; padding: 2px 0px; color: palette(link);"
        )
        self._open_folder_button.clicked.connect(self.open_folder_requested)
        layout.addWidget(self._open_folder_button)
        return box

    # -- public API ------------------------------------------------------------------------

    def set_catalog(self, scan: CatalogScan) -> None:
        """Fill the pickers from a scan and select the remembered (or a sensible) pair."""
        self._catalog_models = tuple(scan.models)
        self._fill_pickers(self._models_for_engine())
        count = len(scan.problems)
        if count:
            noun = "file" if count == 1 else "files"
            self._problems_label.setText(f"{count} {noun} could not be read")
            self._problems_label.setToolTip(
                "\n".join(f"{problem.path.name}: {problem.message}" for problem in scan.problems)
            )
        else:
            self._problems_label.setToolTip("")
        self._problems_label.setVisible(count > 0)

    def _fill_pickers(self, models: tuple[ModelInfo, ...]) -> None:
        self._models = tuple(models)
        self._models_by_path = {str(info.path): info for info in self._models}
        self._filling = True
        try:
            with QSignalBlocker(self._main_combo):
                self._main_combo.clear()
                for info in self._models:
                    self._main_combo.addItem(info.display_name, str(info.path))
                    self._main_combo.setItemData(
                        self._main_combo.count() - 1, str(info.path), Qt.ItemDataRole.ToolTipRole
                    )
                self._main_combo.setCurrentIndex(self._default_main_index())
            self._refill_drafts(self._settings.get_str("last_draft_choice"))
        finally:
            self._filling = False
        has_models = bool(self._models)
        self._empty_label.setVisible(not has_models)
        self._fetch_button.setVisible(not has_models)
        self._problems_label.setVisible(False)
        self._selection_changed(clear_errors=False)

    def selected_main(self) -> ModelInfo | None:
        """The main model picked, or None when the catalog is empty."""
        return self._models_by_path.get(str(self._main_combo.currentData()))

    def selected_draft(self) -> ModelInfo | None:
        """The draft model picked, or None for n-gram lookup, Off, or an empty catalog."""
        return self._models_by_path.get(self.selected_draft_choice())

    def selected_draft_choice(self) -> str:
        """The draft picker's choice: a model path, DRAFT_CHOICE_NGRAM, or DRAFT_CHOICE_OFF."""
        data = self._draft_combo.currentData()
        return data if isinstance(data, str) else ""

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
        elif choice in self._models_by_path:
            draft_path = choice
        else:
            raise SettingsError("Pick a draft model, n-gram lookup or Off")
        return load_request_for(
            self._settings, main.path, draft_path, method, engine=self._selected_engine()
        )

    def setting_widget(self, key: str) -> QWidget:
        """The editor bound to setting ``key`` (KeyError when the sidebar does not show it)."""
        if key == "engine":
            return self._engine_combo
        if key == "speculation_method":
            return self._method_combo
        return self._settings_form.editors[key]

    def set_loading(self, active: bool) -> None:
        """Show (or end) a load in progress; the pickers are locked while it runs."""
        if active:
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
        """Save a system prompt still waiting for typing to pause (call before quitting)."""
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

    def _on_engine_changed(self, _index: int) -> None:
        self._write_setting("engine", self._selected_engine())
        self._fill_pickers(self._models_for_engine())

    def _models_for_engine(self) -> tuple[ModelInfo, ...]:
        """llama.cpp reads GGUF files, MLX reads MLX folders: offer only what can load."""
        wanted = "mlx" if self._selected_engine() == "mlx" else "gguf"
        return tuple(info for info in self._catalog_models if info.format == wanted)

    def _on_main_changed(self, _index: int) -> None:
        if self._filling:
            return
        main = self.selected_main()
        if main is not None:
            self._write_setting("last_main_path", str(main.path))
        self._refill_drafts(self.selected_draft_choice())
        self._selection_changed()

    def _on_draft_changed(self, _index: int) -> None:
        if self._filling:
            return
        choice = self.selected_draft_choice()
        if choice:
            self._write_setting("last_draft_choice", choice)
        self._selection_changed()

    def _on_method_changed(self, _index: int) -> None:
        data = self._method_combo.currentData()
        if isinstance(data, str):
            self._write_setting("speculation_method", data)
        self._selection_changed()

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
        combo = {"engine": self._engine_combo, "speculation_method": self._method_combo}.get(key)
        if combo is not None:
            if combo.currentData() == self._settings.get_str(key):
                return  # the combo itself made the change and has announced it
            show_setting(combo, self._settings, key)
        if key in PAIR_SETTINGS:
            self._selection_changed()

    # -- helpers ---------------------------------------------------------------------------

    def _write_setting(self, key: str, value: str | int | float | bool) -> None:
        self._settings_form.write(key, value)

    def _selected_engine(self) -> EngineKind:
        data = self._engine_combo.currentData()
        for kind in ENGINE_KINDS:
            if data == kind:
                return kind
        return ENGINE_KINDS[0]

    def _default_main_index(self) -> int:
        """The remembered main model, else the default pair's main, else the largest model."""
        if not self._models:
            return -1
        remembered = self._settings.get_str("last_main_path")
        default_name = model_source(DEFAULT_MAIN_KEY).filename
        for index, info in enumerate(self._models):
            if str(info.path) == remembered:
                return index
        for index, info in enumerate(self._models):
            if info.path.name == default_name:
                return index
        return max(range(len(self._models)), key=lambda i: self._models[i].file_size)

    def _refill_drafts(self, wanted: str) -> None:
        """Rebuild the draft list for the selected main model and select ``wanted`` if it fits."""
        main = self.selected_main()
        candidates = compatible_drafts(main, self._models) if main is not None else []
        compatible = [info for info, problem in candidates if problem is None]
        incompatible = [(info, problem) for info, problem in candidates if problem is not None]
        with QSignalBlocker(self._draft_combo):
            self._draft_model.clear()
            for info in compatible:
                self._draft_model.appendRow(_draft_item(info, None))
            if compatible:
                self._draft_combo.insertSeparator(self._draft_combo.count())
            for title, choice, description in (
                (NGRAM_TITLE, DRAFT_CHOICE_NGRAM, NGRAM_DESCRIPTION),
                (OFF_TITLE, DRAFT_CHOICE_OFF, OFF_DESCRIPTION),
            ):
                item = QStandardItem(title)
                item.setData(choice, Qt.ItemDataRole.UserRole)
                item.setToolTip(description)
                self._draft_model.appendRow(item)
            if incompatible:
                self._draft_combo.insertSeparator(self._draft_combo.count())
            for info, problem in incompatible:
                self._draft_model.appendRow(_draft_item(info, problem))
            if main is None:
                self._draft_combo.setCurrentIndex(-1)
            else:
                select_data(self._draft_combo, self._preferred_draft(wanted, main, compatible))

    def _preferred_draft(self, wanted: str, main: ModelInfo, compatible: list[ModelInfo]) -> str:
        """``wanted`` when it is still possible, else the smallest compatible model, else n-gram."""
        if wanted in (DRAFT_CHOICE_NGRAM, DRAFT_CHOICE_OFF):
            return wanted
        if any(str(info.path) == wanted for info in compatible):
            return wanted
        smaller = [info for info in compatible if info.path != main.path]
        if smaller:
            return str(min(smaller, key=lambda info: info.file_size).path)
        return DRAFT_CHOICE_NGRAM

    def _selection_changed(self, *, clear_errors: bool = True) -> None:
        if self._filling:
            return
        self._update_cards()
        self._update_pair_problem(clear_errors=clear_errors)
        self._update_controls()
        self.pair_changed.emit()

    def _update_cards(self) -> None:
        main = self.selected_main()
        self._main_card.setVisible(main is not None)
        if main is not None:
            self._main_card.setText(model_card_html(main))
            self._main_card.setToolTip(str(main.path))
        choice = self.selected_draft_choice()
        draft = self.selected_draft()
        if draft is not None:
            self._draft_card.setText(model_card_html(draft))
            self._draft_card.setToolTip(str(draft.path))
        elif choice == DRAFT_CHOICE_NGRAM:
            self._draft_card.setText(html.escape(NGRAM_DESCRIPTION))
            self._draft_card.setToolTip("")
        elif choice == DRAFT_CHOICE_OFF:
            self._draft_card.setText(html.escape(OFF_DESCRIPTION))
            self._draft_card.setToolTip("")
        self._draft_card.setVisible(bool(choice) and main is not None)

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
        has_models = bool(self._models)
        pickers_enabled = not self._busy and self._state != "loading"
        self._engine_combo.setEnabled(pickers_enabled)
        self._main_combo.setEnabled(pickers_enabled and has_models)
        self._draft_combo.setEnabled(pickers_enabled and has_models)
        self._method_combo.setEnabled(pickers_enabled)
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


def _card() -> QLabel:
    card = QLabel()
    card.setObjectName("modelCard")
    card.setWordWrap(True)
    card.setTextFormat(Qt.TextFormat.RichText)
    card.hide()
    return card


def _make_picker() -> QComboBox:
    combo = CalmComboBox()
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(COMBO_MIN_CONTENT_CHARS)
    combo.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
    return combo


def _draft_item(info: ModelInfo, problem: str | None) -> QStandardItem:
    item = QStandardItem(info.display_name)
    item.setData(str(info.path), Qt.ItemDataRole.UserRole)
    if problem is None:
        item.setToolTip(str(info.path))
    else:
        item.setEnabled(False)
        item.setToolTip(problem)
    return item


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
