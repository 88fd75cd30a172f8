"""The sidebar's models panel: the engine, main model, draft and speculation method pickers.

Fed from a catalog scan; every local model that cannot draft for the main model is listed
greyed with the reason (backends.models.draft_verdict), after the n-gram lookup and Off
choices. "Find my fastest setup…" beside the draft picker opens the trials. Each pick is
remembered in the settings. A view of the choice only: what a load would ask for is the sidebar's.

Signals:
    selection_changed(bool): the engine, main model, draft or method changed; whether an
        error shown for the old choice may be cleared.
    open_folder_requested(): the user wants to see the models folder.
    download_requested(): the user wants models from the Hugging Face hub.
    fetch_default_pair_requested(): the user wants the default model pair downloaded.
    tune_requested(): "Find my fastest setup…" was pressed.
"""

from __future__ import annotations

import html
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from backends.engines.hardware import available_memory
from backends.models.draft_verdict import draft_verdicts
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_source
from backends.service.protocol import ENGINE_KINDS
from gui.form_widgets import ROW_SPACING, CalmComboBox, caption, heading, muted_label, select_data
from gui.settings import DRAFT_CHOICE_NGRAM, DRAFT_CHOICE_OFF, setting_spec
from gui.theme import keep_styled

if TYPE_CHECKING:
    from collections.abc import Callable

    from backends.models.catalog import CatalogScan
    from backends.models.draft_verdict import DraftVerdict
    from backends.models.gguf_info import ModelInfo
    from backends.service.protocol import EngineKind
    from backends.speculation.methods import SpeculationMethod
    from gui.settings import AppSettings

COMBO_MIN_CONTENT_CHARS = 12
MLX_MODULE = "mlx_lm"
MLX_UNAVAILABLE_TOOLTIP = "MLX needs Apple Silicon (or mlx[cpu])"
NGRAM_TITLE = "n-gram lookup (no draft model)"
OFF_TITLE = "Off: main model alone"
NGRAM_DESCRIPTION = (
    "Drafts by looking up text the conversation already holds; no second model to load."
)
OFF_DESCRIPTION = "No drafting: the main model answers alone, token by token."
TUNE_TOOLTIP = (
    "Try plain decoding, every n-gram method, auto and every compatible draft on the loaded "
    "main model, on your last chats or the suite's prompts, and rank them by the speed "
    "measured here (specdeck-bench --tune in a terminal)"
)
NO_MODELS_TEXT = "No GGUF models found in SpecDeck's folder, LM Studio's or the Hugging Face cache."


LEFT_LINK_STYLE = "text-align: left; padding: 2px 0px; color: palette(link);"


def _link_button(text: str, name: str, tooltip: str) -> QPushButton:
    """A flat button that looks like a link (styled by its caller)."""
    button = QPushButton(text)
    button.setObjectName(name)
    button.setFlat(True)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    button.setToolTip(tooltip)
    return button


class ModelsPanel(QWidget):
    """The engine and model pair pickers with a card for each chosen model.

    ``engine_combo`` and ``method_combo`` are the editors of the engine and speculation
    method settings.

    Signals:
        selection_changed(bool): the choice changed; whether old errors may be cleared.
        open_folder_requested(): the user wants to see the models folder.
        download_requested(): the user wants models from the Hugging Face hub.
        fetch_default_pair_requested(): the user wants the default model pair downloaded.
    """

    selection_changed = Signal(bool)
    open_folder_requested = Signal()
    download_requested = Signal()
    tune_requested = Signal()
    fetch_default_pair_requested = Signal()

    def __init__(
        self,
        settings: AppSettings,
        write: Callable[[str, str], None],
        parent: QWidget | None = None,
        *,
        mlx_ok: bool,
    ) -> None:
        super().__init__(parent)
        self._settings = settings
        self._write = write  # stores a setting; a refused value is reported by the caller
        self._catalog_models: tuple[ModelInfo, ...] = ()  # every format
        self._models: tuple[ModelInfo, ...] = ()  # those the selected engine reads
        self._models_by_path: dict[str, ModelInfo] = {}
        self._importable: dict[str, ModelInfo] = {}  # GGUF drafts an MLX main model can import
        self._filling = False
        self._build(mlx_ok)
        self._fill_pickers(())

    @property
    def has_models(self) -> bool:
        """Whether the selected engine has any model to pick."""
        return bool(self._models)

    def model_at(self, path: str) -> ModelInfo | None:
        """The listed model at ``path`` (None when the selected engine lists none there)."""
        return self._models_by_path.get(path) or self._importable.get(path)

    def _announce(self, *, clear_errors: bool) -> None:
        if self._filling:
            return
        self._update_cards()
        self.selection_changed.emit(clear_errors)

    def set_pickers_enabled(self, enabled: bool) -> None:
        """Lock or unlock every picker (a load or an answer is under way)."""
        self.engine_combo.setEnabled(enabled)
        self._main_combo.setEnabled(enabled and self.has_models)
        self._draft_combo.setEnabled(enabled and self.has_models)
        self.method_combo.setEnabled(enabled)

    def _build(self, mlx_ok: bool) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(ROW_SPACING)

        layout.addWidget(heading("Models"))
        engine_spec = setting_spec("engine")
        self.engine_combo = CalmComboBox()
        self.engine_combo.setObjectName("enginePicker")
        self.engine_combo.setToolTip(engine_spec.tooltip)
        engine_model = QStandardItemModel(self.engine_combo)
        for kind in ENGINE_KINDS:
            item = QStandardItem(engine_spec.title_of(kind))
            item.setData(kind, Qt.ItemDataRole.UserRole)
            if kind == "mlx" and not mlx_ok:
                item.setEnabled(False)
                item.setToolTip(MLX_UNAVAILABLE_TOOLTIP)
            engine_model.appendRow(item)
        self.engine_combo.setModel(engine_model)
        select_data(self.engine_combo, self._settings.get_str("engine"), fallback=0)
        self.engine_combo.currentIndexChanged.connect(self._on_engine_changed)
        layout.addWidget(caption("Engine", engine_spec.tooltip))
        layout.addWidget(self.engine_combo)

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
        draft_row = QHBoxLayout()
        draft_row.setContentsMargins(0, 0, 0, 0)
        draft_row.addWidget(
            caption(
                "Draft",
                "A small model with the main model's tokenizer that proposes tokens for the "
                "main model to verify (llama.cpp's --model-draft).",
            )
        )
        draft_row.addStretch(1)
        self.tune_button = _link_button("Find my fastest setup…", "tuneButton", TUNE_TOOLTIP)
        keep_styled(
            self.tune_button,
            lambda chosen: (
                "QPushButton { text-align: right; padding: 0px; color: palette(link); }"
                f" QPushButton:disabled {{ color: {chosen.muted_text.name()}; }}"
            ),
        )
        self.tune_button.clicked.connect(self.tune_requested)
        draft_row.addWidget(self.tune_button)
        layout.addLayout(draft_row)
        layout.addWidget(self._draft_combo)
        self._draft_card = _card()
        layout.addWidget(self._draft_card)
        self.tuning_hint = muted_label()
        self.tuning_hint.setObjectName("tuningHint")
        self.tuning_hint.setToolTip("What Find my fastest setup measured for the loaded model")
        layout.addWidget(self.tuning_hint)

        method_spec = setting_spec("speculation_method")
        self.method_combo = CalmComboBox()
        self.method_combo.setObjectName("methodPicker")
        self.method_combo.setToolTip(method_spec.tooltip)
        method_model = QStandardItemModel(self.method_combo)
        for index, choice in enumerate(method_spec.choices):
            item = QStandardItem(method_spec.title_of(choice))
            item.setData(choice, Qt.ItemDataRole.UserRole)
            if method_spec.choice_tooltips:
                item.setToolTip(method_spec.choice_tooltips[index])
            method_model.appendRow(item)
        self.method_combo.setModel(method_model)
        select_data(self.method_combo, self._settings.get_str(method_spec.key), fallback=0)
        self.method_combo.currentIndexChanged.connect(self._on_method_changed)
        layout.addWidget(caption(method_spec.title, method_spec.tooltip))
        layout.addWidget(self.method_combo)

        self._problems_label = muted_label()
        self._problems_label.setObjectName("problemsLabel")
        layout.addWidget(self._problems_label)

        self._open_folder_button = _link_button(
            "Open models folder…",
            "openFolderButton",
            "Show the folder SpecDeck looks in for GGUF files",
        )
        self._open_folder_button.setStyleSheet(LEFT_LINK_STYLE)
        self._open_folder_button.clicked.connect(self.open_folder_requested)
        self.download_button = _link_button(
            "Download models…",
            "downloadModelsButton",
            "Search the Hugging Face hub; see whether each file can draft for the main model "
            "before downloading it",
        )
        self.download_button.setStyleSheet(LEFT_LINK_STYLE)
        self.download_button.clicked.connect(self.download_requested)
        links = QHBoxLayout()
        links.setContentsMargins(0, 0, 0, 0)
        links.addWidget(self._open_folder_button)
        links.addWidget(self.download_button)
        links.addStretch()
        layout.addLayout(links)

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
        self._announce(clear_errors=False)

    def selected_main(self) -> ModelInfo | None:
        """The main model picked, or None when the catalog is empty."""
        return self._models_by_path.get(str(self._main_combo.currentData()))

    def selected_draft(self) -> ModelInfo | None:
        """The draft model picked, or None for n-gram lookup, Off, or an empty catalog."""
        return self.model_at(self.selected_draft_choice())

    def selected_draft_choice(self) -> str:
        """The draft picker's choice: a model path, DRAFT_CHOICE_NGRAM, or DRAFT_CHOICE_OFF."""
        data = self._draft_combo.currentData()
        return data if isinstance(data, str) else ""

    def _on_engine_changed(self, _index: int) -> None:
        self._write("engine", self.selected_engine())
        self._fill_pickers(self._models_for_engine())

    def _models_for_engine(self) -> tuple[ModelInfo, ...]:
        """llama.cpp reads GGUF files, MLX reads MLX folders: offer only what can load."""
        wanted = "mlx" if self.selected_engine() == "mlx" else "gguf"
        return tuple(info for info in self._catalog_models if info.format == wanted)

    def _on_main_changed(self, _index: int) -> None:
        if self._filling:
            return
        main = self.selected_main()
        if main is not None:
            self._write("last_main_path", str(main.path))
        self._refill_drafts(self.selected_draft_choice())
        self._announce(clear_errors=True)

    def _on_draft_changed(self, _index: int) -> None:
        if self._filling:
            return
        choice = self.selected_draft_choice()
        if choice:
            self._write("last_draft_choice", choice)
        self._announce(clear_errors=True)

    def _on_method_changed(self, _index: int) -> None:
        data = self.method_combo.currentData()
        if isinstance(data, str):
            self._write("speculation_method", data)
        self._announce(clear_errors=True)

    def selected_engine(self) -> EngineKind:
        data = self.engine_combo.currentData()
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
        verdicts = self.draft_verdicts()
        compatible = [verdict.draft for verdict in verdicts if verdict.can_draft]
        importable = [verdict.draft for verdict in verdicts if verdict.kind == "import first"]
        incompatible = [
            verdict
            for verdict in verdicts
            if not verdict.can_draft and verdict.kind != "import first"
        ]
        self._importable = {str(info.path): info for info in importable}
        with QSignalBlocker(self._draft_combo):
            self._draft_model.clear()
            for info in compatible:
                self._draft_model.appendRow(_draft_item(info, None))
            for info in importable:
                item = _draft_item(info, None)
                item.setText(f"{info.display_name} · imported to MLX on load")
                item.setToolTip(f"{info.path}: the same tokenizer; Load imports it to MLX once")
                self._draft_model.appendRow(item)
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
            for verdict in incompatible:
                self._draft_model.appendRow(_draft_item(verdict.draft, verdict.summary))
            if main is None:
                self._draft_combo.setCurrentIndex(-1)
            else:
                select_data(
                    self._draft_combo, self._preferred_draft(wanted, main, compatible + importable)
                )

    def draft_verdicts(
        self, main: ModelInfo | None = None, *, main_loaded: bool = False
    ) -> list[DraftVerdict]:
        """Every local model's verdict as a draft for ``main`` (the selected one), usable first.

        Models of the other format are judged too (an MLX folder for a GGUF main model
        cannot draft; a GGUF file for an MLX main model can once imported), so that the
        reason is given for each. The main model itself is among them (self-speculation).
        ``main_loaded``: the main model is in memory already, only the draft has to fit.
        """
        main = main or self.selected_main()
        if main is None:
            return []
        return draft_verdicts(
            main, self._catalog_models, free_memory=self._free_memory(), main_loaded=main_loaded
        )

    def catalog_model(self, path: str) -> ModelInfo | None:
        """The scanned model at ``path``, of either format."""
        wanted = Path(path)
        return next((info for info in self._catalog_models if Path(info.path) == wanted), None)

    def _free_memory(self) -> int | None:
        try:
            return available_memory()
        except OSError:
            return None

    def select_setup(self, method: SpeculationMethod, draft_path: str | None) -> None:
        """Pick a setup: the draft (or n-gram lookup, or Off) and the speculation method."""
        if method == "off":
            choice = DRAFT_CHOICE_OFF
        elif draft_path is not None:
            choice = draft_path
        else:
            choice = DRAFT_CHOICE_NGRAM
        if method != "off":
            select_data(self.method_combo, method)
        select_data(self._draft_combo, choice)

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
