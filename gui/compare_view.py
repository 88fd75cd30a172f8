"""Side by side: one prompt answered with speculation, then by the main model alone."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor, QTextCursor
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from backends.speculation.types import TokenOrigin
from gui.answer_text import AnswerBrowser, AnswerStyles, AnswerWriter, highlighted_text, text_runs
from gui.style import METER_REPAINT_MS, TOKEN_FLUSH_MS
from gui.theme import MUTED_TEXT_STYLE, keep_styled, text_colour

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.speculation.types import EmittedToken, SpeculationStats

Run = Literal["speculative", "plain"]
RUNS: tuple[Run, ...] = get_args(Run)
ColumnState = Literal["idle", "waiting", "running", "done", "stopped"]

PLAIN_TITLE = "Main model alone"
SPECULATIVE_TITLE_PREFIX = "Speculative · "
WAITING_TEXT = "waiting…"
RUNNING_TEXT = "generating…"
IDLE_PLACEHOLDERS: dict[str, str] = {
    "speculative": "Send a message: the answer with speculation comes here,",
    "plain": "then the main model alone answers it here.",
}
STOPPED_TEXT = "stopped"
IDENTICAL_TEXT = "Identical text"
DIFFERENT_TEXT = "Texts differ"
NO_SPEEDUP_TEXT = "Speedup not measured: the main model alone produced no speed to compare"
LEGEND_TEXT = "Green: drafted tokens the main model accepted"
GRAMMAR_LEGEND_TEXT = "Green: accepted draft tokens · blue: the schema's own tokens"
LEGEND_OFF_TEXT = "Draft highlighting is off"
PLAIN_SUBTITLE = "The same prompt, one token per step, no drafting"

BROWSER_RADIUS_PX = 6
DOCUMENT_MARGIN_PX = 10
COLUMN_SPACING_PX = 14
BADGE_RADIUS_PX = 10
BADGE_TINT_ALPHA = 28  # of 255: a faint wash of the badge's colour behind its text
TITLE_POINT_SCALE = 1.05
SPEED_POINT_SCALE = 1.1
BANNER_POINT_SCALE = 1.25
SMALL_POINT_SCALE = 0.9


def speedup_banner_text(speedup: float) -> str:
    """``"1.42× faster with speculation"`` or ``"0.91×: speculation was slower here"``."""
    if speedup >= 1.0:
        return f"{speedup:.2f}× faster with speculation"
    return f"{speedup:.2f}×: speculation was slower here"


def _speed_text(stats: SpeculationStats) -> str:
    return f"{stats.tokens_per_second:.1f} tok/s"


def _badge_style(colour: QColor) -> str:
    return (
        f"color: {colour.name()}; background: {_rgba(colour, BADGE_TINT_ALPHA)};"
        f" border: 1px solid {colour.name()}; border-radius: {BADGE_RADIUS_PX}px;"
        " padding: 2px 10px; font-weight: bold;"
    )


def _rgba(colour: QColor, alpha: int) -> str:
    return f"rgba({colour.red()}, {colour.green()}, {colour.blue()}, {alpha})"


class _Column(QWidget):
    """One run's answer: a header with its title and live speed, the text, a status line.

    Only the speculative column shows drafts: every token of the main model alone is its own.

    Signals: none.
    """

    def __init__(self, run: Run, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run = run
        self.state: ColumnState = "waiting"
        self.stats: SpeculationStats | None = None
        self.tokens: list[EmittedToken] = []
        self.pending: list[EmittedToken] = []
        self.marks_drafts = run == "speculative"
        self.visualize_drafts = True

        self.title = QLabel()
        title_font = self.font()
        title_font.setPointSizeF(title_font.pointSizeF() * TITLE_POINT_SCALE)
        title_font.setBold(True)
        self.title.setFont(title_font)
        self.title.setWordWrap(True)
        self.speed = QLabel()
        speed_font = self.font()
        speed_font.setPointSizeF(speed_font.pointSizeF() * SPEED_POINT_SCALE)
        speed_font.setBold(True)
        self.speed.setFont(speed_font)
        self.speed.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        # Both columns have a subtitle, so that their texts start at the same height.
        self.subtitle = QLabel(LEGEND_TEXT if run == "speculative" else PLAIN_SUBTITLE)
        self.subtitle.setObjectName(f"{run}-subtitle")
        keep_styled(self.subtitle, MUTED_TEXT_STYLE)
        small_font = self.font()
        small_font.setPointSizeF(small_font.pointSizeF() * SMALL_POINT_SCALE)
        self.subtitle.setFont(small_font)

        self.browser = AnswerBrowser()
        self.browser.setObjectName(f"{run}-answer")
        self.browser.setReadOnly(True)
        self.browser.setOpenLinks(False)
        self.document = self.browser.document()
        self.document.setUndoRedoEnabled(False)
        self.document.setDocumentMargin(DOCUMENT_MARGIN_PX)
        keep_styled(
            self.browser,
            lambda chosen: (
                f"QTextBrowser {{ background: {chosen.answer_background.name()};"
                f" border: 1px solid {chosen.subtle_line.name()};"
                f" border-radius: {BROWSER_RADIUS_PX}px; }}"
            ),
        )
        self._cursor = QTextCursor(self.document)
        self._writer = self._start_text()

        self.status = QLabel()
        keep_styled(self.status, MUTED_TEXT_STYLE)
        self.status.setFont(small_font)

        header = QHBoxLayout()
        header.setSpacing(8)
        header.addWidget(self.title, 1)
        header.addWidget(self.speed, 0)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addLayout(header)
        layout.addWidget(self.subtitle)
        layout.addWidget(self.browser, 1)
        layout.addWidget(self.status)

    def reset(self, title: str, state: ColumnState) -> None:
        self.title.setText(title)
        self.state = state
        self.stats = None
        self.tokens.clear()
        self.pending.clear()
        self._writer = self._start_text()
        self._update_header()
        self._update_status()

    def flush(self) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        self.tokens.extend(batch)
        self._write(batch)

    def set_visualize_drafts(self, on: bool) -> None:
        self.visualize_drafts = on
        self.browser.set_origin_tooltips(on)
        self.rerender()

    def rerender(self) -> None:
        self.flush()
        self._writer = self._start_text()
        self._write(self.tokens)

    def highlighted_text(self) -> str:
        end = QTextCursor(self.document)
        end.movePosition(QTextCursor.MoveOperation.End)
        return highlighted_text(text_runs(self.document, 0, end.position()))

    def _start_text(self) -> AnswerWriter:
        """Empty the document; the writer returned appends an answer to it."""
        self.document.clear()
        self._cursor = QTextCursor(self.document)
        styles = AnswerStyles(self.document.defaultFont(), self.visualize_drafts)
        self._cursor.setBlockFormat(styles.prose_block)
        return AnswerWriter(self._cursor, styles)

    def _write(self, tokens: Sequence[EmittedToken]) -> None:
        scrollbar = self.browser.verticalScrollBar()
        # Follow the answer only while the reader is at its end, never pull them back down.
        at_end = scrollbar.value() >= scrollbar.maximum()
        self._cursor.beginEditBlock()
        for token in tokens:
            if token.text:
                origin = token.origin if self.marks_drafts else TokenOrigin.TARGET
                self._writer.write(token.text, origin)
        self._writer.render()
        self._cursor.endEditBlock()
        if at_end:
            scrollbar.setValue(scrollbar.maximum())

    def _update_header(self) -> None:
        self.speed.setText("" if self.stats is None else _speed_text(self.stats))

    def _update_status(self) -> None:
        placeholder = {"waiting": WAITING_TEXT, "idle": IDLE_PLACEHOLDERS[self.run]}
        self.browser.setPlaceholderText(placeholder.get(self.state, ""))
        stats = self.stats
        if self.state == "idle":
            text = ""
        elif self.state == "waiting":
            text = WAITING_TEXT
        elif self.state == "running":
            text = RUNNING_TEXT
            if stats is not None:
                text = f"{RUNNING_TEXT} {stats.generated_tokens} tokens"
        elif stats is None:
            text = STOPPED_TEXT if self.state == "stopped" else ""
        else:
            parts = [
                f"{stats.generated_tokens} tokens",
                f"{stats.total_seconds:.2f} s",
                _speed_text(stats),
            ]
            if self.run == "speculative" and stats.acceptance_rate is not None:
                parts.append(f"{stats.acceptance_rate * 100:.0f}% of drafts accepted")
            if self.state == "stopped":
                parts.insert(0, STOPPED_TEXT)
            text = " · ".join(parts)
        self.status.setText(text)

    def update_display(self) -> None:
        self._update_header()
        self._update_status()


class CompareView(QWidget):
    """Two answers to one prompt side by side: with speculation, and the main model alone.

    Tokens and stats arrive at any rate; the text is appended every ``TOKEN_FLUSH_MS`` and
    the speeds are repainted every ``METER_REPAINT_MS``.

    Emits no signals.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._columns: dict[Run, _Column] = {run: _Column(run) for run in RUNS}
        self._visualize_drafts = True
        self._shows_grammar = False  # an answer with grammar tokens: the legend names them

        self._flush_timer = QTimer(self)
        self._flush_timer.setSingleShot(True)
        self._flush_timer.setInterval(TOKEN_FLUSH_MS)
        self._flush_timer.timeout.connect(self._update_text)
        self._stats_timer = QTimer(self)
        self._stats_timer.setSingleShot(True)
        self._stats_timer.setInterval(METER_REPAINT_MS)
        self._stats_timer.timeout.connect(self._update_speeds)

        self._banner = QLabel()
        self._banner.setObjectName("speedup-banner")
        banner_font = self.font()
        banner_font.setPointSizeF(banner_font.pointSizeF() * BANNER_POINT_SCALE)
        banner_font.setBold(True)
        self._banner.setFont(banner_font)
        self._banner.setWordWrap(True)
        self._banner.hide()
        self._badge = QLabel()
        self._badge.setObjectName("identical-badge")
        self._badge.hide()

        banner_row = QHBoxLayout()
        banner_row.setSpacing(12)
        banner_row.addWidget(self._banner, 1)
        banner_row.addWidget(self._badge, 0, Qt.AlignmentFlag.AlignVCenter)
        columns = QHBoxLayout()
        columns.setSpacing(COLUMN_SPACING_PX)
        for run in RUNS:
            columns.addWidget(self._columns[run], 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 10, 12, 10)
        layout.setSpacing(8)
        layout.addLayout(banner_row)
        layout.addLayout(columns, 1)
        self._columns["speculative"].reset("Speculative", "idle")
        self._columns["plain"].reset(PLAIN_TITLE, "idle")
        self._update_result_hidden()

    # --- what the main window calls -------------------------------------------------------

    def begin(self, speculative_label: str) -> None:
        """A comparison starts: empty columns, the speculative run first, the other waiting."""
        self._flush_timer.stop()
        self._stats_timer.stop()
        title = SPECULATIVE_TITLE_PREFIX + speculative_label if speculative_label else "Speculative"
        self._columns["speculative"].reset(title, "running")
        self._columns["plain"].reset(PLAIN_TITLE, "waiting")
        self._shows_grammar = False
        self._update_legend()
        self._update_result_hidden()

    def append_tokens(self, run: Run, tokens: Sequence[EmittedToken]) -> None:
        """Queue ``tokens`` for ``run``'s column; they appear on the next flush."""
        column = self._columns[run]
        self._mark_started(column)
        column.pending.extend(tokens)
        if not self._flush_timer.isActive():
            self._flush_timer.start()

    def update_stats(self, run: Run, stats: SpeculationStats) -> None:
        """Take a live snapshot for ``run``; its speed follows on the next repaint."""
        column = self._columns[run]
        self._mark_started(column)
        column.stats = stats
        if run == "speculative" and stats.grammar_tokens_count and not self._shows_grammar:
            self._shows_grammar = True  # the legend names the grammar's colour too
            self._update_legend()
        if not self._stats_timer.isActive():
            self._stats_timer.start()

    def finish_run(self, run: Run, stats: SpeculationStats) -> None:
        """``run`` ended with ``stats``: its final speed, token count and time."""
        column = self._columns[run]
        column.flush()
        column.stats = stats
        column.state = "done"
        column.update_display()

    def set_result(self, speedup: float | None, identical: bool | None) -> None:
        """After both runs: the speedup banner, and whether the texts match (None: no badge)."""
        if speedup is None:
            self._banner.setText(NO_SPEEDUP_TEXT)
            keep_styled(self._banner, MUTED_TEXT_STYLE)
        else:
            self._banner.setText(speedup_banner_text(speedup))
            keep_styled(
                self._banner,
                text_colour("good" if speedup >= 1.0 else "warn"),
            )
        self._banner.show()
        if identical is None:
            self._badge.setText("")
            self._badge.hide()
            return
        self._badge.setText(IDENTICAL_TEXT if identical else DIFFERENT_TEXT)
        self._badge.setToolTip(
            "At temperature 0 speculation must not change the text: both runs wrote the same"
            if identical
            else "The two answers are not the same text"
        )
        keep_styled(
            self._badge, lambda chosen: _badge_style(chosen.good if identical else chosen.bad)
        )
        self._badge.show()

    def cancel(self) -> None:
        """The comparison was stopped: every unfinished column says so."""
        self._flush_timer.stop()
        self._stats_timer.stop()
        for column in self._columns.values():
            column.flush()
            if column.state != "done":
                column.state = "stopped"
            column.update_display()

    def set_visualize_drafts(self, on: bool) -> None:
        """Show (or not) the speculative column's accepted draft tokens on green.

        Both columns tell the origin of the token under the mouse only while this is on.
        """
        if self._visualize_drafts == on:
            return
        self._visualize_drafts = on
        self._update_legend()
        for column in self._columns.values():
            column.set_visualize_drafts(on)

    def rerender(self) -> None:
        """Render both columns again (after a theme change)."""
        for column in self._columns.values():
            column.rerender()

    def _update_legend(self) -> None:
        legend = GRAMMAR_LEGEND_TEXT if self._shows_grammar else LEGEND_TEXT
        self._columns["speculative"].subtitle.setText(
            legend if self._visualize_drafts else LEGEND_OFF_TEXT
        )

    # --- readback -------------------------------------------------------------------------

    def column_text(self, run: Run) -> str:
        """The text displayed in ``run``'s column."""
        return self._columns[run].browser.toPlainText()

    def column_title_text(self, run: Run) -> str:
        """The title in ``run``'s header."""
        return self._columns[run].title.text()

    def column_speed_text(self, run: Run) -> str:
        """The speed displayed in ``run``'s header ("" before any stats)."""
        return self._columns[run].speed.text()

    def column_status_text(self, run: Run) -> str:
        """The status line under ``run``'s column ("waiting…", "stopped", the totals)."""
        return self._columns[run].status.text()

    def speedup_text(self) -> str:
        """The banner's text ("" while hidden)."""
        return self._banner.text() if not self._banner.isHidden() else ""

    def badge_text(self) -> str:
        """The identical/different badge's text ("" while hidden)."""
        return self._badge.text() if not self._badge.isHidden() else ""

    def highlighted_text(self, run: Run = "speculative") -> str:
        """``run``'s text on a draft background, read back from its document."""
        return self._columns[run].highlighted_text()

    # --- timers and updates ---------------------------------------------------------------

    def _update_result_hidden(self) -> None:
        for label in (self._banner, self._badge):
            label.setText("")
            label.hide()

    def _mark_started(self, column: _Column) -> None:
        if column.state == "waiting":
            column.state = "running"
            column.update_display()

    def _update_text(self) -> None:
        for column in self._columns.values():
            column.flush()

    def _update_speeds(self) -> None:
        for column in self._columns.values():
            column.update_display()
