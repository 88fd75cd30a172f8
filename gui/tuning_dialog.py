"""The "Find my fastest setup" window: every setup measured here, ranked, explained, applied.

A view only. The main window fills in the main model, the drafts' verdicts (every local
model, with the reason for each that cannot draft) and where the prompts come from; the
engine process runs the trials and the main window passes their progress and result in.
The table ranks the setups by measured speed over plain decoding on the same prompts,
with the spread between prompts, the acceptance, the speedup the theory predicts from the
measured parts, and whether the text was the same as plain decoding's; selecting a row
shows its explanation. "Use it" applies the fastest setup (the draft picker and the
speculation method) and loads it.

Signals:
    start_requested(float): Start (or Run again) was pressed; the time budget in seconds.
    cancel_requested(): Cancel was pressed during a run.
    apply_requested(str, object): use this setup: its method and draft path (or None).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from backends.service.tuning import DEFAULT_BUDGET_SECONDS, MIN_BUDGET_SECONDS, winner
from gui.form_widgets import CalmSpinBox, caption, heading, muted_label
from gui.style import colours
from gui.theme import ERROR_TEXT_STYLE, NO_STYLE, keep_styled

if TYPE_CHECKING:
    from backends.models.draft_verdict import DraftVerdict
    from backends.service.tuning import TuningRow
    from backends.service.tuning_memory import RememberedTuning

MAX_BUDGET_SECONDS = 1800
RESULT_COLUMNS = (
    "Setup",
    "tok/s",
    "× plain",
    "Spread",
    "Accepted",
    "Predicted",
    "Same text",
    "Why",
)
DRAFT_COLUMNS = ("Model", "Verdict", "Why")
BUDGET_TOOLTIP = (
    "How long the trials may take. Each setup answers the same prompts; a short budget "
    "means shorter answers and fewer prompts"
)


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _cell(text: str, tooltip: str = "", *, right: bool = False) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)
    if tooltip:
        item.setToolTip(tooltip)
    if right:
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def _table(columns: tuple[str, ...]) -> QTableWidget:
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(list(columns))
    table.verticalHeader().setVisible(False)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setWordWrap(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setStretchLastSection(True)
    return table


def _texts(table: QTableWidget) -> list[list[str]]:
    rows = []
    for row in range(table.rowCount()):
        items = [table.item(row, column) for column in range(table.columnCount())]
        rows.append([item.text() if item is not None else "" for item in items])
    return rows


class TuningDialog(QDialog):
    """Find my fastest setup: budget, progress, Cancel, the ranking, the drafts' verdicts."""

    start_requested = Signal(float)
    cancel_requested = Signal()
    apply_requested = Signal(str, object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Find my fastest setup")
        self.setObjectName("tuningDialog")
        self.resize(900, 640)
        layout = QVBoxLayout(self)
        self.title = heading("Find my fastest setup")
        layout.addWidget(self.title)
        self.intro = muted_label(" ")
        layout.addWidget(self.intro)

        row = QHBoxLayout()
        row.addWidget(caption("Time budget", BUDGET_TOOLTIP))
        self.budget = CalmSpinBox()
        self.budget.setObjectName("tuningBudget")
        self.budget.setRange(int(MIN_BUDGET_SECONDS), MAX_BUDGET_SECONDS)
        self.budget.setSingleStep(30)
        self.budget.setValue(int(DEFAULT_BUDGET_SECONDS))
        self.budget.setSuffix(" s")
        self.budget.setToolTip(BUDGET_TOOLTIP)
        row.addWidget(self.budget)
        self.start_button = QPushButton("Start")
        self.start_button.setObjectName("tuningStart")
        self.start_button.setDefault(True)
        self.start_button.clicked.connect(self._on_start)
        row.addWidget(self.start_button)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("tuningCancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel_requested)
        row.addWidget(self.cancel_button)
        row.addStretch(1)
        layout.addLayout(row)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.hide()
        layout.addWidget(self.progress)
        self.status = QLabel()
        self.status.setObjectName("tuningStatus")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)

        self.results = _table(RESULT_COLUMNS)
        self.results.setObjectName("tuningResults")
        self.results.itemSelectionChanged.connect(self._show_why)
        layout.addWidget(self.results, 3)
        self.why = QLabel()
        self.why.setObjectName("tuningWhy")
        self.why.setWordWrap(True)
        self.why.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.why)
        best_row = QHBoxLayout()
        self.best = QLabel()
        self.best.setObjectName("tuningBest")
        self.best.setWordWrap(True)
        best_row.addWidget(self.best, 1)
        self.use_button = QPushButton("Use it")
        self.use_button.setObjectName("tuningUse")
        self.use_button.setToolTip("Pick this setup in the sidebar and load it")
        self.use_button.setEnabled(False)
        self.use_button.clicked.connect(self._on_use)
        best_row.addWidget(self.use_button)
        layout.addLayout(best_row)

        layout.addWidget(caption("Drafts", "Every local model, and whether it can draft"))
        self.drafts = _table(DRAFT_COLUMNS)
        self.drafts.setObjectName("tuningDrafts")
        self.drafts.setWordWrap(True)
        layout.addWidget(self.drafts, 2)
        close_row = QHBoxLayout()
        close_row.addStretch(1)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        close_row.addWidget(close)
        layout.addLayout(close_row)

        self._rows: list[TuningRow] = []
        self._winner: TuningRow | None = None
        self._verdicts: list[DraftVerdict] = []
        self._running = False

    # -- what the main window tells it -------------------------------------------------------

    def set_context(self, main_name: str, prompt_source: str, verdicts: list[DraftVerdict]) -> None:
        """The loaded main model, where the prompts come from, and every draft's verdict."""
        self.title.setText(f"Find my fastest setup for {main_name}")
        usable = sum(1 for verdict in verdicts if verdict.can_draft)
        if usable:
            drafts = f"the {usable} compatible draft{'s' if usable != 1 else ''}"
        else:
            drafts = "no draft model (none below can draft)"
        self.intro.setText(
            f"Tries plain decoding, each n-gram method, auto and {drafts} on {prompt_source}, "
            "at temperature 0 so that every setup writes the same text, and ranks them by "
            "the speed measured on this machine. Your chats are not touched."
        )
        self.intro.show()
        self._verdicts = list(verdicts)
        self.drafts.setRowCount(0)
        for verdict in verdicts:
            row = self.drafts.rowCount()
            self.drafts.insertRow(row)
            self.drafts.setItem(row, 0, _cell(verdict.draft.path.name, str(verdict.draft.path)))
            self.drafts.setItem(row, 1, _cell(verdict.title, verdict.summary))
            self.drafts.setItem(row, 2, _cell(verdict.reason, verdict.reason))
        self.drafts.resizeRowsToContents()
        self.recolour()

    def recolour(self) -> None:
        """Mark the drafts that can draft and the fastest setup in the colours in use now.

        The tables keep the colours they were filled in; a change of theme calls this.
        """
        for index, verdict in enumerate(self._verdicts):
            if verdict.can_draft and (cell := self.drafts.item(index, 1)) is not None:
                cell.setBackground(colours().draft_background)
        for index, result in enumerate(self._rows):
            if result is self._winner and (cell := self.results.item(index, 0)) is not None:
                cell.setBackground(colours().draft_background)

    def set_running(self, running: bool) -> None:
        """Lock the budget and Start while the trials run; Cancel only then."""
        self._running = running
        self.start_button.setEnabled(not running)
        self.budget.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        self.use_button.setEnabled(not running and self._winner is not None)
        self.progress.setVisible(running)
        if running:
            self.progress.setValue(0)
            self.status.setText("Starting…")
            keep_styled(self.status, NO_STYLE)

    @property
    def running(self) -> bool:
        """Whether trials are under way."""
        return self._running

    def set_progress(self, fraction: float, message: str) -> None:
        """How far the trials are, and what runs now."""
        self.progress.setValue(round(1000 * fraction))
        self.status.setText(f"{message}…" if message else "")

    def show_result(
        self,
        tuning: RememberedTuning | None,
        *,
        recalled: bool,
        cancelled: bool,
        changes: list[str],
    ) -> None:
        """Fill the ranking (a recalled result says when it was measured, or what changed)."""
        self.set_running(False)
        if tuning is None:
            self.status.setText("Not measured on this machine yet: press Start.")
            return
        self._rows = list(tuning.rows)
        self._winner = winner(self._rows)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(tuning.measured_at))
        facts = (
            f"{len(tuning.prompts)} prompt{'s' if len(tuning.prompts) != 1 else ''} "
            f"({', '.join(tuning.prompts)}), {tuning.trial_tokens} tokens each, "
            f"{tuning.seconds:.0f} s, {tuning.key.threads} threads, {tuning.key.accelerator}"
        )
        if cancelled:
            self.status.setText(f"Cancelled: what was measured so far ({facts}).")
        elif recalled and changes:
            self.status.setText(
                f"Measured {when} with {'; '.join(changes)}: run again for this machine."
            )
        elif recalled:
            self.status.setText(f"Measured {when} on this machine ({facts}). Run again to check.")
        else:
            self.status.setText(f"Measured now ({facts}).")
        self.start_button.setText("Run again")
        self._fill_results()
        best = self._winner
        if best is None:
            self.best.setText("")
        elif best.method == "off":
            self.best.setText(
                "Fastest here: plain decoding. Speculation does not pay on this "
                "machine for these prompts."
            )
        else:
            self.best.setText(
                f"Fastest here: <b>{best.label}</b>, {_times(best.speedup)} plain decoding."
            )
        self.use_button.setEnabled(best is not None and not (recalled and changes))

    def show_error(self, message: str) -> None:
        """A run that ended with an error: the message, in red."""
        self.set_running(False)
        self.status.setText(f"The trials stopped: {message}")
        keep_styled(self.status, ERROR_TEXT_STYLE)

    # -- reading it (tests, the main window) -------------------------------------------------

    def result_rows(self) -> list[list[str]]:
        """The ranking as shown, one list of cell texts per row."""
        return _texts(self.results)

    def draft_rows(self) -> list[list[str]]:
        """The drafts' verdicts as shown."""
        return _texts(self.drafts)

    # -- inside ------------------------------------------------------------------------------

    def _fill_results(self) -> None:
        self.results.setRowCount(0)
        for row in self._rows:
            index = self.results.rowCount()
            self.results.insertRow(index)
            tip = row.explanation or row.skipped
            self.results.setItem(index, 0, _cell(row.label, tip))
            if not row.measured:
                self.results.setItem(index, 1, _cell(row.skipped, row.skipped))
                self.results.setSpan(index, 1, 1, len(RESULT_COLUMNS) - 1)
                continue
            spread = row.spread
            cells = (
                f"{row.tokens_per_second:.1f}",
                _times(row.speedup),
                f"{spread[0]:.2f}–{spread[1]:.2f}×" if spread else "–",
                "–" if row.acceptance_rate is None else f"{row.acceptance_rate:.0%}",
                _times(row.predicted),
                "yes" if row.identical else "NO",
                row.explanation,
            )
            for column, text in enumerate(cells, start=1):
                self.results.setItem(index, column, _cell(text, tip, right=column < 6))
        self.recolour()
        if self._rows:
            self.results.selectRow(0)

    def _show_why(self) -> None:
        selected = self.results.selectedItems()
        if not selected:
            self.why.setText("")
            return
        row = self._rows[selected[0].row()]
        text = row.explanation or row.skipped or "plain decoding: the main model alone"
        self.why.setText(f"<b>{row.label}</b>: {text}")

    def _on_start(self) -> None:
        self.start_requested.emit(float(self.budget.value()))

    def _on_use(self) -> None:
        if self._winner is not None:
            self.apply_requested.emit(self._winner.method, self._winner.draft_path)
