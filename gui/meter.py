"""The live acceptance-rate meter: how much of the draft the main model is keeping."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from gui.meter_painting import (
    NO_DRAFTS_TEXT,
    NO_VALUE,
    SMALL_POINT_SCALE,
    AcceptanceGauge,
    PositionBars,
    acceptance_colour,
    percent_text,
    scaled_font,
)
from gui.style import METER_REPAINT_MS
from gui.theme import MUTED_TEXT_STYLE, NO_STYLE, keep_styled

if TYPE_CHECKING:
    from backends.speculation.types import SpeculationStats

MeterState = Literal["idle", "running", "done"]

RECENT_ROUNDS = 16

IDLE_CAPTION = "Idle: nothing is generating"
DONE_CAPTION = "last answer"

TITLE_POINT_SCALE = 1.1
TILE_VALUE_POINT_SCALE = 1.25

# Friendlier names for the drafters' report names (stats.rounds_by_method keys).
METHOD_DISPLAY_NAMES = {
    "ngram-simple": "n-gram",
    "ngram-mod": "n-gram (mod)",
    "edit-copy": "edit copy",
    "none": "none",
}
DRAFT_MODEL_PREFIX = "draft model"


def method_display_name(method: str) -> str:
    """A short name for a stats.rounds_by_method key ("ngram-simple" -> "n-gram")."""
    if method in METHOD_DISPLAY_NAMES:
        return METHOD_DISPLAY_NAMES[method]
    if method.startswith(DRAFT_MODEL_PREFIX):
        return DRAFT_MODEL_PREFIX
    return method


@dataclass(frozen=True)
class _RoundsDelta:
    """What one stats update added: rounds run, tokens drafted and tokens accepted."""

    rounds: int
    drafted: int
    accepted: int


class RecentWindow:
    """Acceptance over the last ``size`` rounds, fed with consecutive stats snapshots."""

    def __init__(self, size: int = RECENT_ROUNDS) -> None:
        self.size = size
        self._deltas: deque[_RoundsDelta] = deque()
        self._rounds_held = 0
        self._last: tuple[int, int, int] = (0, 0, 0)

    def clear(self) -> None:
        """Forget everything; the next snapshot counts from zero."""
        self._deltas.clear()
        self._rounds_held = 0
        self._last = (0, 0, 0)

    def add(self, stats: SpeculationStats) -> None:
        """Record what changed since the previous snapshot."""
        current = (
            stats.rounds,
            stats.total_draft_tokens_count,
            stats.accepted_draft_tokens_count,
        )
        if any(now < before for now, before in zip(current, self._last, strict=True)):
            # Counts went backwards: a new generation began without start().
            self.clear()
        rounds, drafted, accepted = (
            now - before for now, before in zip(current, self._last, strict=True)
        )
        self._last = current
        if rounds == 0 and drafted == 0:
            return
        self._deltas.append(_RoundsDelta(rounds, drafted, accepted))
        self._rounds_held += rounds
        while self._deltas and self._rounds_held - self._deltas[0].rounds >= self.size:
            self._rounds_held -= self._deltas.popleft().rounds

    def acceptance(self) -> float | None:
        """Accepted / drafted over the last ``size`` rounds (None when nothing was drafted)."""
        rounds_left = self.size
        drafted = 0.0
        accepted = 0.0
        for delta in reversed(self._deltas):
            if rounds_left <= 0:
                break
            # An update spanning more rounds than the window still has room for only
            # contributes its share: the rounds inside one update are indistinguishable.
            share = 1.0 if delta.rounds <= rounds_left else rounds_left / delta.rounds
            drafted += delta.drafted * share
            accepted += delta.accepted * share
            rounds_left -= delta.rounds
        if drafted <= 0.0:
            return None
        return accepted / drafted


class _StatTile(QWidget):
    """A muted caption over a bold value."""

    def __init__(self, caption: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.caption = QLabel(caption)
        self.caption.setFont(scaled_font(self.font(), SMALL_POINT_SCALE))
        keep_styled(self.caption, MUTED_TEXT_STYLE)
        self.value = QLabel(NO_VALUE)
        self.value.setFont(scaled_font(self.font(), TILE_VALUE_POINT_SCALE, bold=True))
        layout.addWidget(self.caption)
        layout.addWidget(self.value)


COUNT_NAMES = ("drafted", "accepted", "rejected", "ignored", "grammar")
GRAMMAR_COUNT = "grammar"  # shown only in answers with a grammar (Structured output)


class _CountsRow(QWidget):
    """The draft-token counts, each a bold number over a muted name.

    Also the tokens a grammar allowed alone (verified with no drafting), where there were any.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        self._numbers: dict[str, QLabel] = {}
        self._columns: dict[str, QWidget] = {}
        for name in COUNT_NAMES:
            column = QWidget()
            column_layout = QVBoxLayout(column)
            column_layout.setContentsMargins(0, 0, 0, 0)
            column_layout.setSpacing(0)
            number = QLabel(NO_VALUE)
            number.setFont(scaled_font(self.font(), 1.0, bold=True))
            caption = QLabel(name)
            caption.setFont(scaled_font(self.font(), SMALL_POINT_SCALE))
            keep_styled(caption, MUTED_TEXT_STYLE)
            column_layout.addWidget(number)
            column_layout.addWidget(caption)
            layout.addWidget(column, 1)
            self._numbers[name] = number
            self._columns[name] = column
        self._columns[GRAMMAR_COUNT].setToolTip(
            "Tokens the structured output's schema allowed alone: verified with no drafting"
        )
        self._columns[GRAMMAR_COUNT].hide()

    def set_counts(self, counts: tuple[int, int, int, int, int] | None) -> None:
        """Show drafted, accepted, rejected, ignored and grammar (None: dashes).

        The grammar's count is shown only where it is above 0.
        """
        for index, name in enumerate(COUNT_NAMES):
            self._numbers[name].setText(NO_VALUE if counts is None else str(counts[index]))
        self._columns[GRAMMAR_COUNT].setHidden(counts is None or counts[-1] == 0)

    def text(self) -> str:
        """``"Drafted 100 · accepted 70 · rejected 28 · ignored 2"`` as displayed.

        ``" · grammar 9"`` follows where the grammar's count is shown.
        """
        shown = [name for name in COUNT_NAMES if not self._columns[name].isHidden()]
        text = " · ".join(f"{name} {self._numbers[name].text()}" for name in shown)
        return text[:1].upper() + text[1:]


class AcceptanceMeter(QWidget):
    """How well speculation is going: recent and whole-answer acceptance, speed, counts.

    The main window hands it every stats snapshot (possibly a hundred a second); it keeps
    the latest and repaints every ``METER_REPAINT_MS``.

    Emits no signals.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._state: MeterState = "idle"
        self._method_label = ""
        self._prompt_tokens = 0  # the prompt being read before the first token (0: none)
        self._stats: SpeculationStats | None = None
        self._window = RecentWindow(RECENT_ROUNDS)
        self._recent: float | None = None

        self._repaint_timer = QTimer(self)
        self._repaint_timer.setSingleShot(True)
        self._repaint_timer.setInterval(METER_REPAINT_MS)
        self._repaint_timer.timeout.connect(self._update_display)

        self._title = QLabel("Draft acceptance")
        self._title.setFont(scaled_font(self.font(), TITLE_POINT_SCALE, bold=True))
        self._caption = QLabel(IDLE_CAPTION)
        self._caption.setFont(scaled_font(self.font(), SMALL_POINT_SCALE))
        keep_styled(self._caption, MUTED_TEXT_STYLE)
        self._gauge = AcceptanceGauge()
        self._overall = _StatTile("Whole answer")
        self._speed = _StatTile("Speed")
        self._counts = _CountsRow()
        self._positions_caption = QLabel("Acceptance by draft position")
        self._positions_caption.setFont(scaled_font(self.font(), SMALL_POINT_SCALE))
        keep_styled(self._positions_caption, MUTED_TEXT_STYLE)
        self._positions = PositionBars()
        self._methods = QLabel()
        self._methods.setWordWrap(True)
        self._methods.setFont(scaled_font(self.font(), SMALL_POINT_SCALE))
        keep_styled(self._methods, MUTED_TEXT_STYLE)

        tiles = QHBoxLayout()
        tiles.setSpacing(12)
        tiles.addWidget(self._overall, 1)
        tiles.addWidget(self._speed, 1)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 10, 12, 10)
        layout.setSpacing(6)
        header = QVBoxLayout()
        header.setSpacing(0)
        header.addWidget(self._title)
        header.addWidget(self._caption)
        layout.addLayout(header)
        layout.addWidget(self._gauge, 1)
        layout.addLayout(tiles)
        layout.addWidget(self._counts)
        layout.addSpacing(2)
        layout.addWidget(self._positions_caption)
        layout.addWidget(self._positions)
        layout.addWidget(self._methods)
        layout.addStretch(0)
        self._update_display()

    # --- what the main window calls -------------------------------------------------------

    def start(self, method_label: str) -> None:
        """A generation begins with ``method_label`` (e.g. "auto · drafting")."""
        self._clear_values()
        self._state = "running"
        self._method_label = method_label
        self._prompt_tokens = 0
        self._update_display()

    def prompt_started(self, prompt_tokens: int) -> None:
        """The engine reads a prompt of ``prompt_tokens`` tokens; said until the first tokens.

        On a slow machine (or MLX's CPU build) a long prompt takes seconds to minutes before
        anything streams: the caption says what the wait is.
        """
        self._prompt_tokens = prompt_tokens
        self._update_caption()

    def update_stats(self, stats: SpeculationStats) -> None:
        """Take a live snapshot; the display follows on the next repaint tick."""
        self._stats = stats
        self._window.add(stats)
        self._recent = self._window.acceptance()
        if not self._repaint_timer.isActive():
            self._repaint_timer.start()

    def finish(self, stats: SpeculationStats) -> None:
        """The generation ended with ``stats``: show its final values as the last answer's."""
        self._stats = stats
        self._window.add(stats)
        self._recent = self._window.acceptance()
        self._state = "done"
        self._repaint_timer.stop()
        self._update_display()

    def reset(self) -> None:
        """Back to idle, with no numbers from an earlier answer."""
        self._clear_values()
        self._state = "idle"
        self._method_label = ""
        self._update_display()

    # --- readback -------------------------------------------------------------------------

    @property
    def state(self) -> MeterState:
        """``"idle"``, ``"running"`` or ``"done"``."""
        return self._state

    @property
    def recent_acceptance(self) -> float | None:
        """Accepted / drafted over the last RECENT_ROUNDS rounds."""
        return self._recent

    @property
    def overall_acceptance(self) -> float | None:
        """Accepted / drafted over the whole answer."""
        return None if self._stats is None else self._stats.acceptance_rate

    @property
    def tokens_per_second(self) -> float:
        """Generation speed of the latest snapshot (0 when idle)."""
        return 0.0 if self._stats is None else self._stats.tokens_per_second

    @property
    def position_acceptance(self) -> list[float | None]:
        """Acceptance at each draft position, from the latest snapshot."""
        return [] if self._stats is None else self._stats.acceptance_by_position

    def value_texts(self) -> dict[str, str]:
        """The texts as currently displayed, keyed by what they show."""
        return {
            "recent": self._gauge.value_text(),
            "overall": self._overall.value.text(),
            "speed": self._speed.value.text(),
            "counts": self._counts.text(),
            "positions": self._positions.summary_text(),
            "methods": self._methods.text(),
            "caption": self._caption.text(),
        }

    # --- display --------------------------------------------------------------------------

    def _clear_values(self) -> None:
        self._repaint_timer.stop()
        self._stats = None
        self._window.clear()
        self._recent = None

    def _update_display(self) -> None:
        self._update_caption()
        self._update_gauge()
        self._update_tiles()
        self._update_counts()
        self._update_positions()
        self._update_methods()

    def _update_caption(self) -> None:
        if self._state == "idle":
            text = IDLE_CAPTION
        elif self._state == "running":
            text = self._method_label or "generating"
            if self._stats is None and self._prompt_tokens:
                text = f"{text} · reading the prompt ({self._prompt_tokens:,} tokens)…"
        else:
            text = f"{DONE_CAPTION} · {self._method_label}" if self._method_label else DONE_CAPTION
        self._caption.setText(text)

    def _update_gauge(self) -> None:
        if self._state == "idle":
            caption = ""
        elif self._recent is None and self._stats and self._stats.total_draft_tokens_count:
            caption = f"no drafts in the last {RECENT_ROUNDS} rounds"
        elif self._recent is None:
            caption = "nothing drafted yet"
        else:
            caption = f"last {RECENT_ROUNDS} rounds"
        self._gauge.set_value(self._recent, caption)

    def _update_tiles(self) -> None:
        stats = self._stats
        overall = None if stats is None else stats.acceptance_rate
        self._overall.value.setText(percent_text(overall))
        if overall is not None:
            keep_styled(
                self._overall.value,
                lambda chosen: f"color: {acceptance_colour(overall, chosen).name()};",
            )
        else:
            keep_styled(self._overall.value, NO_STYLE)
        speed = NO_VALUE if stats is None else f"{stats.tokens_per_second:.1f} tok/s"
        self._speed.value.setText(speed)

    def _update_counts(self) -> None:
        stats = self._stats
        self._counts.set_counts(
            None
            if stats is None
            else (
                stats.total_draft_tokens_count,
                stats.accepted_draft_tokens_count,
                stats.rejected_draft_tokens_count,
                stats.ignored_draft_tokens_count,
                stats.grammar_tokens_count,
            )
        )

    def _update_positions(self) -> None:
        idle = self._state == "idle"
        self._positions.set_values(self.position_acceptance, "" if idle else NO_DRAFTS_TEXT)
        self._positions_caption.setHidden(idle)
        self._positions.setHidden(idle)

    def _update_methods(self) -> None:
        stats = self._stats
        by_method = {} if stats is None else stats.rounds_by_method
        total = sum(by_method.values())
        if len(by_method) <= 1 or total == 0:
            self._methods.setText("")
            self._methods.setToolTip("")
            self._methods.hide()
            return
        ordered = sorted(by_method.items(), key=lambda item: (-item[1], item[0]))
        self._methods.setText(
            "Rounds: "
            + " · ".join(
                f"{method_display_name(method)} {count / total * 100:.0f}%"
                for method, count in ordered
            )
        )
        self._methods.setToolTip(
            "\n".join(f"{method}: {count} rounds" for method, count in ordered)
        )
        self._methods.show()
