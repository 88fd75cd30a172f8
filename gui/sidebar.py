"""The model sidebar: engine, main and draft pickers, load state, and the settings form."""

from __future__ import annotations

import html
import importlib.util
import logging
from typing import TYPE_CHECKING, Literal

from PySide6.QtCore import QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from backends.catalog import compatible_drafts
from backends.engine_protocol import ENGINE_KINDS
from backends.errors import SettingsError
from backends.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_source
from gui.settings import (
    DRAFT_CHOICE_NGRAM,
    DRAFT_CHOICE_OFF,
    SETTINGS,
    load_request_for,
    setting_spec,
    speculation_method,
)
from gui.style import ERROR_TEXT, GOOD, MUTED_TEXT

if TYPE_CHECKING:
    from PySide6.QtGui import QHideEvent, QWheelEvent

    from backends.catalog import CatalogScan
    from backends.engine import LoadReport
    from backends.engine_protocol import EngineKind, LoadRequest
    from backends.gguf_info import ModelInfo
    from gui.settings import AppSettings, SettingSpec

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
FORM_GROUPS: tuple[tuple[str, str], ...] = (
    ("speculation", "Speculation"),
    ("sampling", "Sampling"),
    ("generation", "Generation"),
    ("view", "View"),
)
SHOWN_WITH_THE_MODELS = frozenset({"speculation_method"})
# Settings that change what a load asks for (and so the memory a pair needs).
PAIR_SETTINGS = frozenset({"engine", "speculation_method", "context_size"})

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


class _CalmSpinBox(QSpinBox):
    """A spin box that lets the wheel scroll the sidebar unless it has the focus."""

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802 (Qt's name)
        if self.hasFocus():
            super().wheelEvent(event)
        else:
            event.ignore()


class _CalmDoubleSpinBox(QDoubleSpinBox):
    """A double spin box that lets the wheel scroll the sidebar unless it has the focus."""

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802 (Qt's name)
        if self.hasFocus():
            super().wheelEvent(event)
        else:
            event.ignore()


class _CalmComboBox(QComboBox):
    """A combo box that lets the wheel scroll the sidebar unless it has the focus."""

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802 (Qt's name)
        if self.hasFocus():
            super().wheelEvent(event)
        else:
            event.ignore()


class _Section(QWidget):
    """A titled group whose body folds away when its header is clicked."""

    def __init__(self, title: str, body: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._header = QToolButton(self)
        self._header.setText(title)
        self._header.setCheckable(True)
        self._header.setChecked(True)
        self._header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self._header.setArrowType(Qt.ArrowType.DownArrow)
        self._header.setAutoRaise(True)
        self._header.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        font = self._header.font()
        font.setBold(True)
        self._header.setFont(font)
        self._body = body
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(ROW_SPACING)
        layout.addWidget(self._header)
        layout.addWidget(body)
        self._header.toggled.connect(self._update_expanded)

    @property
    def header(self) -> QToolButton:
        """The button that folds and unfolds the section."""
        return self._header

    def _update_expanded(self, expanded: bool) -> None:
        self._header.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        self._body.setVisible(expanded)


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
        self._setting_widgets: dict[str, QWidget] = {}
        self._form_captions: list[QLabel] = []
        self._prompt_timer = QTimer(self)
        self._prompt_timer.setSingleShot(True)
        self._prompt_timer.setInterval(SYSTEM_PROMPT_SAVE_DELAY_MS)
        self._prompt_timer.timeout.connect(self._save_system_prompt)

        self.setMinimumWidth(SIDEBAR_MIN_WIDTH)
        content = QWidget()
        content.setObjectName("sidebarContent")
        layout = QVBoxLayout(content)
        layout.setContentsMargins(CONTENT_MARGIN, CONTENT_MARGIN, CONTENT_MARGIN, CONTENT_MARGIN)
        layout.setSpacing(SECTION_SPACING)
        layout.addWidget(self._build_models_section())
        layout.addWidget(self._build_load_section())
        for group, title in FORM_GROUPS:
            layout.addWidget(_Section(title, self._build_settings_form(group), content))
        self._align_form_captions()
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
        settings.changed.connect(self._update_from_setting)
        self._fill_pickers(())

    # -- building --------------------------------------------------------------------------

    def _build_models_section(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(ROW_SPACING)

        layout.addWidget(_heading("Models"))
        engine_spec = setting_spec("engine")
        self._engine_combo = _CalmComboBox()
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
        self._select_data(self._engine_combo, self._settings.get_str("engine"), fallback=0)
        self._engine_combo.currentIndexChanged.connect(self._on_engine_changed)
        self._setting_widgets[engine_spec.key] = self._engine_combo
        layout.addWidget(_caption("Engine", engine_spec.tooltip))
        layout.addWidget(self._engine_combo)

        self._main_combo = _make_picker()
        self._main_combo.setObjectName("mainPicker")
        self._main_combo.setPlaceholderText("No models found")
        self._main_combo.currentIndexChanged.connect(self._on_main_changed)
        layout.addWidget(_caption("Main model", "The model whose answer you get."))
        layout.addWidget(self._main_combo)
        self._empty_label = _muted_label(NO_MODELS_TEXT)
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
            _caption(
                "Draft",
                "A small model with the main model's tokenizer that proposes tokens for the "
                "main model to verify (llama.cpp's --model-draft).",
            )
        )
        layout.addWidget(self._draft_combo)
        self._draft_card = _card()
        layout.addWidget(self._draft_card)

        method_spec = setting_spec("speculation_method")
        self._method_combo = _CalmComboBox()
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
        self._select_data(self._method_combo, self._settings.get_str(method_spec.key), fallback=0)
        self._method_combo.currentIndexChanged.connect(self._on_method_changed)
        self._setting_widgets[method_spec.key] = self._method_combo
        layout.addWidget(_caption(method_spec.title, method_spec.tooltip))
        layout.addWidget(self._method_combo)

        self._problems_label = _muted_label()
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

    def _build_load_section(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(ROW_SPACING)
        self._load_button = QPushButton("Load")
        self._load_button.setObjectName("loadButton")
        self._load_button.setDefault(True)
        self._load_button.clicked.connect(self._on_load_clicked)
        layout.addWidget(self._load_button)
        self._progress_bar = QProgressBar()
        self._progress_bar.setObjectName("loadProgress")
        self._progress_bar.setRange(0, PROGRESS_STEPS)
        self._progress_bar.setTextVisible(False)
        self._progress_bar.setMaximumHeight(8)
        self._progress_bar.hide()
        layout.addWidget(self._progress_bar)
        self._progress_label = _muted_label()
        self._progress_label.setObjectName("loadProgressMessage")
        self._progress_label.hide()
        layout.addWidget(self._progress_label)
        self._status_label = QLabel()
        self._status_label.setObjectName("loadStatus")
        self._status_label.setStyleSheet(f"color: {GOOD.name()}; font-weight: bold;")
        self._status_label.hide()
        layout.addWidget(self._status_label)
        self._placement_label = QLabel()
        self._placement_label.setWordWrap(True)
        self._placement_label.setTextFormat(Qt.TextFormat.PlainText)
        self._placement_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._placement_label.hide()
        layout.addWidget(self._placement_label)
        self._error_label = QLabel()
        self._error_label.setObjectName("errorLabel")
        self._error_label.setWordWrap(True)
        self._error_label.setTextFormat(Qt.TextFormat.PlainText)
        self._error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._error_label.hide()
        layout.addWidget(self._error_label)
        return box

    def _build_settings_form(self, group: str) -> QWidget:
        box = QWidget()
        form = QFormLayout(box)
        form.setContentsMargins(0, 0, 0, 0)
        form.setVerticalSpacing(ROW_SPACING + 2)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        for spec in SETTINGS:
            if spec.group != group or spec.key in SHOWN_WITH_THE_MODELS:
                continue
            editor = self._make_editor(spec)
            editor.setObjectName(f"setting_{spec.key}")
            editor.setToolTip(spec.tooltip)
            self._setting_widgets[spec.key] = editor
            if isinstance(editor, QCheckBox):
                form.addRow(editor)
            elif isinstance(editor, QPlainTextEdit):
                form.addRow(_caption(spec.title, spec.tooltip))
                form.addRow(editor)
            else:
                caption = _caption(spec.title, spec.tooltip)
                self._form_captions.append(caption)
                form.addRow(caption, editor)
        return box

    def _align_form_captions(self) -> None:
        """One caption width for every section, so that the fields line up down the form."""
        width = max((label.sizeHint().width() for label in self._form_captions), default=0)
        for label in self._form_captions:
            label.setMinimumWidth(width)

    def _make_editor(self, spec: SettingSpec) -> QWidget:
        key = spec.key
        if spec.kind is bool:
            check = QCheckBox(spec.title)
            check.setChecked(self._settings.get_bool(key))
            check.toggled.connect(lambda on: self._write_setting(key, on))
            return check
        if spec.kind is int:
            spin = _CalmSpinBox()
            _prepare_spin(spin, spec)
            spin.setRange(int(spec.minimum or 0), int(spec.maximum or 0))
            if spec.step is not None:
                spin.setSingleStep(int(spec.step))
            spin.setValue(self._settings.get_int(key))
            spin.valueChanged.connect(lambda value: self._write_setting(key, int(value)))
            return spin
        if spec.kind is float:
            double = _CalmDoubleSpinBox()
            _prepare_spin(double, spec)
            double.setDecimals(FLOAT_DECIMALS)
            double.setRange(spec.minimum or 0.0, spec.maximum or 0.0)
            if spec.step is not None:
                double.setSingleStep(spec.step)
            double.setValue(self._settings.get_float(key))
            double.valueChanged.connect(lambda value: self._write_setting(key, float(value)))
            return double
        if spec.choices:
            combo = _CalmComboBox()
            for choice in spec.choices:
                combo.addItem(spec.title_of(choice), choice)
            self._select_data(combo, self._settings.get_str(key), fallback=0)
            combo.currentIndexChanged.connect(
                lambda _index: self._write_setting(key, str(combo.currentData()))
            )
            return combo
        text = QPlainTextEdit()
        text.setPlaceholderText("None")
        text.setTabChangesFocus(True)
        text.setPlainText(self._settings.get_str(key))
        line_height = text.fontMetrics().lineSpacing()
        text.setFixedHeight(line_height * SYSTEM_PROMPT_LINES + 2 * CONTENT_MARGIN)
        # Only the system prompt is a text box; it is saved when typing pauses.
        text.textChanged.connect(self._prompt_timer.start)
        return text

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
        return self._setting_widgets[key]

    def set_loading(self, active: bool) -> None:
        """Show (or end) a load in progress; the pickers are locked while it runs."""
        if active:
            self._state = "loading"
            self.clear_error()
            self._status_label.hide()
            self._placement_label.hide()
            self._progress_bar.setRange(0, PROGRESS_STEPS)
            self._progress_bar.setValue(0)
            self._progress_bar.show()
            self._progress_label.setText("Loading…")
            self._progress_label.show()
        else:
            if self._state == "loading":
                self._state = "unloaded"
            self._progress_bar.hide()
            self._progress_label.hide()
        self._update_controls()

    def set_load_progress(self, fraction: float, message: str) -> None:
        """Move the progress bar to ``fraction`` (0..1; negative: busy without a fraction)."""
        if fraction < 0:
            self._progress_bar.setRange(0, 0)
        else:
            self._progress_bar.setRange(0, PROGRESS_STEPS)
            self._progress_bar.setValue(round(min(fraction, 1.0) * PROGRESS_STEPS))
        self._progress_bar.show()
        self._progress_label.setText(message)
        self._progress_label.setVisible(bool(message))

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
        self._progress_bar.hide()
        self._progress_label.hide()
        self.clear_error()
        lines = [f"Main: {main.placement}"]
        if draft is not None:
            lines.append(f"Draft: {draft.placement}")
        notes = [*extra_notes, *main.notes, *(draft.notes if draft is not None else ())]
        # A note both models share is said once; a bullet each keeps wrapped notes apart.
        lines.extend(f"{NOTE_BULLET}{note}" for note in dict.fromkeys(notes))
        if seconds is None:
            seconds = main.load_seconds + (draft.load_seconds if draft is not None else 0.0)
        self._status_label.setText(f"● Loaded in {seconds:.1f} s")
        self._status_label.show()
        self._placement_label.setText("\n".join(lines))
        tooltip = [f"{main.model_name}: {main.n_ctx:,}-token context, {main.n_threads} threads"]
        if draft is not None:
            tooltip.append(f"{draft.model_name}: {draft.n_ctx:,}-token context (draft)")
        self._placement_label.setToolTip("\n".join(tooltip))
        self._placement_label.show()
        self._update_controls()

    def set_unloaded(self) -> None:
        """Back to nothing loaded."""
        self._state = "unloaded"
        self._loaded_request = None
        self._progress_bar.hide()
        self._progress_label.hide()
        self._status_label.hide()
        self._placement_label.hide()
        self._placement_label.clear()
        self._update_controls()

    def show_error(self, message: str) -> None:
        """Show ``message`` in red under the Load button until the next load or selection."""
        self._error_label.setText(message)
        self._error_label.show()

    def clear_error(self) -> None:
        """Hide the error message."""
        self._pair_problem = None
        self._error_label.clear()
        self._error_label.hide()

    def error_text(self) -> str:
        """The error shown, or "" when none is."""
        return self._error_label.text() if self._error_label.isVisibleTo(self) else ""

    def placement_text(self) -> str:
        """The placement lines shown after a load, or "" when nothing is loaded."""
        return self._placement_label.text() if self._placement_label.isVisibleTo(self) else ""

    def flush_pending_edits(self) -> None:
        """Save a system prompt still waiting for typing to pause (call before quitting)."""
        if self._prompt_timer.isActive():
            self._prompt_timer.stop()
            self._save_system_prompt()

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

    def _save_system_prompt(self) -> None:
        editor = self._setting_widgets.get("system_prompt")
        if isinstance(editor, QPlainTextEdit):
            self._write_setting("system_prompt", editor.toPlainText())

    def _update_from_setting(self, key: str) -> None:
        """Show a setting's new value in its editor (when it changed somewhere else)."""
        editor = self._setting_widgets.get(key)
        if editor is not None:
            with QSignalBlocker(editor):
                if isinstance(editor, QCheckBox):
                    editor.setChecked(self._settings.get_bool(key))
                elif isinstance(editor, QSpinBox):
                    editor.setValue(self._settings.get_int(key))
                elif isinstance(editor, QDoubleSpinBox):
                    editor.setValue(self._settings.get_float(key))
                elif isinstance(editor, QComboBox):
                    if editor.currentData() == self._settings.get_str(key):
                        return  # the combo itself made the change and has announced it
                    self._select_data(editor, self._settings.get_str(key))
                elif isinstance(editor, QPlainTextEdit):
                    value = self._settings.get_str(key)
                    if editor.toPlainText() != value:
                        editor.setPlainText(value)
        if key in PAIR_SETTINGS:
            self._selection_changed()

    # -- helpers ---------------------------------------------------------------------------

    def _write_setting(self, key: str, value: str | int | float | bool) -> None:
        try:
            self._settings.set(key, value)
        except SettingsError as error:
            self.show_error(str(error))

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
                self._select_data(
                    self._draft_combo, self._preferred_draft(wanted, main, compatible)
                )

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

    @staticmethod
    def _select_data(combo: QComboBox, data: str, fallback: int | None = None) -> None:
        index = combo.findData(data)
        if index >= 0:
            combo.setCurrentIndex(index)
        elif fallback is not None:
            combo.setCurrentIndex(fallback)

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
        if self._state == "loading":
            self._button_action = "load"
            self._load_button.setText("Loading…")
            self._load_button.setEnabled(False)
            return
        if self._state == "loaded" and not self._selection_differs_from_loaded():
            self._button_action = "unload"
            self._load_button.setText("Unload")
            self._load_button.setToolTip("Free the memory the loaded models hold")
            self._load_button.setEnabled(not self._busy)
            return
        self._button_action = "load"
        reload = self._state == "loaded"
        self._load_button.setText("Reload" if reload else "Load")
        self._load_button.setToolTip(
            "Load the selected pair with these settings in place of the loaded one"
            if reload
            else "Load the selected models"
        )
        self._load_button.setEnabled(not self._busy and has_models)

    def _selection_differs_from_loaded(self) -> bool:
        if self._loaded_request is None:
            return False
        try:
            return self.load_request() != self._loaded_request
        except SettingsError:
            return True


NOTE_BULLET = "• "


def _heading(text: str) -> QLabel:
    label = QLabel(text)
    font = label.font()
    font.setBold(True)
    font.setPointSizeF(font.pointSizeF() * 1.1)
    label.setFont(font)
    return label


def _caption(text: str, tooltip: str) -> QLabel:
    label = QLabel(text)
    label.setToolTip(tooltip)
    return label


def _muted_label(text: str = "") -> QLabel:
    label = QLabel(text)
    label.setWordWrap(True)
    label.setStyleSheet(f"color: {MUTED_TEXT.name()};")
    if not text:
        label.hide()
    return label


def _card() -> QLabel:
    card = QLabel()
    card.setObjectName("modelCard")
    card.setWordWrap(True)
    card.setTextFormat(Qt.TextFormat.RichText)
    card.hide()
    return card


def _make_picker() -> QComboBox:
    combo = _CalmComboBox()
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(COMBO_MIN_CONTENT_CHARS)
    combo.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
    return combo


def _prepare_spin(spin: QSpinBox | QDoubleSpinBox, spec: SettingSpec) -> None:
    # Commit on Enter, arrows or focus loss, not on every digit typed.
    spin.setKeyboardTracking(False)
    spin.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
    spin.setAlignment(Qt.AlignmentFlag.AlignRight)
    if spec.special_text:
        spin.setSpecialValueText(spec.special_text)


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
