"""The live acceptance-rate meter: how much of the draft the main model is keeping."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from PySide6.QtCore import QRectF, QSize, Qt, QTimer
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPen
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from gui.style import BAD, GOOD, METER_REPAINT_MS, MUTED_TEXT, SUBTLE_LINE, WARN

if TYPE_CHECKING:
    from PySide6.QtGui import QPaintEvent

    from backends.speculation.types import SpeculationStats

MeterState = Literal["idle", "running", "done"]

RECENT_ROUNDS = 16
GOOD_ACCEPTANCE = 0.6  # at or above: the draft is clearly paying for itself
WARN_ACCEPTANCE = 0.3  # below: most drafted tokens are wasted work

NO_VALUE = "—"
IDLE_CAPTION = "Idle: nothing is generating"
DONE_CAPTION = "last answer"
NO_DRAFTS_TEXT = "No drafts yet"

TRACK_COLOUR = SUBTLE_LINE
EMPTY_BAR_COLOUR = QColor("#c4c9d1")
VALUE_TEXT_COLOUR = QColor("#1f2937")

GAUGE_START_DEGREES = 210.0
GAUGE_SWEEP_DEGREES = 240.0
GAUGE_PEN_WIDTH = 12
GAUGE_MIN_HEIGHT = 80
GAUGE_PREFERRED_HEIGHT = 116
GAUGE_MAX_HEIGHT = 132
GAUGE_VALUE_POINT_SCALE = 2.0
QT_DEGREE_UNITS = 16  # QPainter.drawArc takes sixteenths of a degree
ARC_HEIGHT_SHARE = 0.75  # a 240-degree arc open at the bottom: 1 + sin(30°) radii tall

BARS_HEIGHT = 60
BAR_GAP = 4
BAR_MAX_WIDTH = 30
BAR_LABEL_HEIGHT = 14
BAR_CORNER_RADIUS = 2.0
LONG_LABEL_MIN_SLOT = 40  # narrower slots label a bar "3" instead of "pos 3"
PERCENT_LABEL_MIN_SLOT = 30

SMALL_POINT_SCALE = 0.85
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


def acceptance_colour(value: float) -> QColor:
    """GOOD, WARN or BAD for an acceptance share in [0, 1]."""
    if value >= GOOD_ACCEPTANCE:
        return GOOD
    if value >= WARN_ACCEPTANCE:
        return WARN
    return BAD


def percent_text(value: float | None) -> str:
    """``0.823`` as ``"82%"``, None as a dash."""
    return NO_VALUE if value is None else f"{value * 100:.0f}%"


def method_display_name(method: str) -> str:
    """A short name for a stats.rounds_by_method key ("ngram-simple" -> "n-gram")."""
    if method in METHOD_DISPLAY_NAMES:
        return METHOD_DISPLAY_NAMES[method]
    if method.startswith(DRAFT_MODEL_PREFIX):
        return DRAFT_MODEL_PREFIX
    return method


def _scaled_font(base: QFont, scale: float, *, bold: bool = False) -> QFont:
    font = QFont(base)
    font.setPointSizeF(base.pointSizeF() * scale)
    font.setBold(bold)
    return font


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


class AcceptanceGauge(QWidget):
    """A 240-degree arc filled to the recent acceptance, with the percentage in its middle.

    Emits no signals.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._value: float | None = None
        self._caption = ""
        self.setMinimumHeight(GAUGE_MIN_HEIGHT)
        self.setMaximumHeight(GAUGE_MAX_HEIGHT)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        """Room for the arc and its text."""
        return QSize(GAUGE_PREFERRED_HEIGHT * 2, GAUGE_PREFERRED_HEIGHT)

    def set_value(self, value: float | None, caption: str) -> None:
        """Show ``value`` (None: an empty arc and a dash) with ``caption`` under it."""
        self._value = value
        self._caption = caption
        self.setToolTip(
            f"Share of drafted tokens the main model kept, {caption}"
            if value is not None
            else "No drafted tokens to measure yet"
        )
        self.update()

    def value_text(self) -> str:
        """The percentage as painted."""
        return percent_text(self._value)

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt's name)
        """Draw the track, the filled part and the texts."""
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        small_font = _scaled_font(self.font(), SMALL_POINT_SCALE)
        caption_height = QFontMetrics(small_font).height()
        margin = GAUGE_PEN_WIDTH / 2 + 2
        # The arc's lowest points are at 3/4 of its circle's diameter; the caption sits
        # under them, so the circle fits the height left once the caption has its row.
        room_for_arc = self.height() - margin - GAUGE_PEN_WIDTH / 2 - caption_height
        diameter = max(0.0, min(self.width() - 2 * margin, room_for_arc / ARC_HEIGHT_SHARE))
        left = (self.width() - diameter) / 2
        arc_rect = QRectF(left, margin, diameter, diameter)

        track_pen = QPen(TRACK_COLOUR, GAUGE_PEN_WIDTH)
        track_pen.setCapStyle(Qt.PenCapStyle.RoundCap)
        painter.setPen(track_pen)
        start = int(GAUGE_START_DEGREES * QT_DEGREE_UNITS)
        painter.drawArc(arc_rect, start, int(-GAUGE_SWEEP_DEGREES * QT_DEGREE_UNITS))

        if self._value is not None and self._value > 0.0:
            value_pen = QPen(acceptance_colour(self._value), GAUGE_PEN_WIDTH)
            value_pen.setCapStyle(Qt.PenCapStyle.RoundCap)
            painter.setPen(value_pen)
            sweep = GAUGE_SWEEP_DEGREES * min(self._value, 1.0)
            painter.drawArc(arc_rect, start, int(-sweep * QT_DEGREE_UNITS))

        value_font = _scaled_font(self.font(), GAUGE_VALUE_POINT_SCALE, bold=True)
        painter.setFont(value_font)
        painter.setPen(VALUE_TEXT_COLOUR if self._value is not None else MUTED_TEXT)
        value_height = painter.fontMetrics().height()
        value_rect = QRectF(
            arc_rect.left(), arc_rect.center().y() - value_height / 2, diameter, value_height
        )
        painter.drawText(value_rect, Qt.AlignmentFlag.AlignCenter, self.value_text())

        painter.setFont(small_font)
        painter.setPen(MUTED_TEXT)
        caption_top = margin + diameter * ARC_HEIGHT_SHARE + GAUGE_PEN_WIDTH / 2
        caption_rect = QRectF(0, caption_top, self.width(), caption_height)
        painter.drawText(caption_rect, Qt.AlignmentFlag.AlignCenter, self._caption)
        painter.end()


class PositionBars(QWidget):
    """Small bars: the acceptance at each draft position (None: not reached, drawn empty).

    Emits no signals.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._values: list[float | None] = []
        self._empty_text = ""
        self.setFixedHeight(BARS_HEIGHT)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_values(self, values: list[float | None], empty_text: str = NO_DRAFTS_TEXT) -> None:
        """Show one bar per draft position, or ``empty_text`` when there are none."""
        self._values = list(values)
        self._empty_text = empty_text
        self.setToolTip(self.summary_text() if values else "")
        self.update()

    def values(self) -> list[float | None]:
        """The values the bars show."""
        return list(self._values)

    def summary_text(self) -> str:
        """``"pos 1 92% · pos 2 80% · pos 3 —"``, or the empty text when there are no bars."""
        if not self._values:
            return self._empty_text
        return " · ".join(
            f"pos {position} {percent_text(value)}"
            for position, value in enumerate(self._values, start=1)
        )

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt's name)
        """Draw the bars, their labels and, where there is room, their percentages."""
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        small_font = _scaled_font(self.font(), SMALL_POINT_SCALE)
        painter.setFont(small_font)
        if not self._values:
            painter.setPen(MUTED_TEXT)
            painter.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, self._empty_text)
            painter.end()
            return

        count = len(self._values)
        slot = self.width() / count
        bar_width = min(BAR_MAX_WIDTH, slot - BAR_GAP)
        show_percent = slot >= PERCENT_LABEL_MIN_SLOT
        top = BAR_LABEL_HEIGHT if show_percent else 0.0
        bottom = self.height() - BAR_LABEL_HEIGHT
        full_height = bottom - top
        for index, value in enumerate(self._values):
            centre_x = slot * index + slot / 2
            bar_left = centre_x - bar_width / 2
            track = QRectF(bar_left, top, bar_width, full_height)
            if value is None:
                empty_pen = QPen(EMPTY_BAR_COLOUR, 1.0, Qt.PenStyle.DashLine)
                painter.setPen(empty_pen)
                painter.setBrush(Qt.BrushStyle.NoBrush)
                painter.drawRoundedRect(
                    track.adjusted(0.5, 0.5, -0.5, -0.5), BAR_CORNER_RADIUS, BAR_CORNER_RADIUS
                )
            else:
                painter.setPen(Qt.PenStyle.NoPen)
                painter.setBrush(TRACK_COLOUR)
                painter.drawRoundedRect(track, BAR_CORNER_RADIUS, BAR_CORNER_RADIUS)
                filled_height = full_height * min(max(value, 0.0), 1.0)
                if filled_height > 0.0:
                    painter.setBrush(acceptance_colour(value))
                    filled = QRectF(bar_left, bottom - filled_height, bar_width, filled_height)
                    painter.drawRoundedRect(filled, BAR_CORNER_RADIUS, BAR_CORNER_RADIUS)
            painter.setPen(MUTED_TEXT)
            position = index + 1
            label = f"pos {position}" if slot >= LONG_LABEL_MIN_SLOT else str(position)
            label_rect = QRectF(slot * index, bottom, slot, BAR_LABEL_HEIGHT)
            painter.drawText(label_rect, Qt.AlignmentFlag.AlignCenter, label)
            if show_percent:
                percent_rect = QRectF(slot * index, 0, slot, BAR_LABEL_HEIGHT)
                painter.drawText(percent_rect, Qt.AlignmentFlag.AlignCenter, percent_text(value))
        painter.end()


class _StatTile(QWidget):
    """A muted caption over a bold value."""

    def __init__(self, caption: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.caption = QLabel(caption)
        self.caption.setFont(_scaled_font(self.font(), SMALL_POINT_SCALE))
        self.caption.setStyleSheet(f"color: {MUTED_TEXT.name()};")
        self.value = QLabel(NO_VALUE)
        self.value.setFont(_scaled_font(self.font(), TILE_VALUE_POINT_SCALE, bold=True))
        layout.addWidget(self.caption)
        layout.addWidget(self.value)


COUNT_NAMES = ("drafted", "accepted", "rejected", "ignored")


class _CountsRow(QWidget):
    """The draft-token counts, each a bold number over a muted name."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        self._numbers: dict[str, QLabel] = {}
        for name in COUNT_NAMES:
            column = QVBoxLayout()
            column.setSpacing(0)
            number = QLabel(NO_VALUE)
            number.setFont(_scaled_font(self.font(), 1.0, bold=True))
            caption = QLabel(name)
            caption.setFont(_scaled_font(self.font(), SMALL_POINT_SCALE))
            caption.setStyleSheet(f"color: {MUTED_TEXT.name()};")
            column.addWidget(number)
            column.addWidget(caption)
            layout.addLayout(column, 1)
            self._numbers[name] = number

    def set_counts(self, counts: tuple[int, int, int, int] | None) -> None:
        """Show drafted, accepted, rejected and ignored (None: dashes)."""
        for index, name in enumerate(COUNT_NAMES):
            self._numbers[name].setText(NO_VALUE if counts is None else str(counts[index]))

    def text(self) -> str:
        """``"Drafted 100 · accepted 70 · rejected 28 · ignored 2"`` as displayed."""
        text = " · ".join(f"{name} {self._numbers[name].text()}" for name in COUNT_NAMES)
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
        self._title.setFont(_scaled_font(self.font(), TITLE_POINT_SCALE, bold=True))
        self._caption = QLabel(IDLE_CAPTION)
        self._caption.setFont(_scaled_font(self.font(), SMALL_POINT_SCALE))
        self._caption.setStyleSheet(f"color: {MUTED_TEXT.name()};")
        self._gauge = AcceptanceGauge()
        self._overall = _StatTile("Whole answer")
        self._speed = _StatTile("Speed")
        self._counts = _CountsRow()
        self._positions_caption = QLabel("Acceptance by draft position")
        self._positions_caption.setFont(_scaled_font(self.font(), SMALL_POINT_SCALE))
        self._positions_caption.setStyleSheet(f"color: {MUTED_TEXT.name()};")
        self._positions = PositionBars()
        self._methods = QLabel()
        self._methods.setWordWrap(True)
        self._methods.setFont(_scaled_font(self.font(), SMALL_POINT_SCALE))
        self._methods.setStyleSheet(f"color: {MUTED_TEXT.name()};")

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
            self._overall.value.setStyleSheet(f"color: {acceptance_colour(overall).name()};")
        else:
            self._overall.value.setStyleSheet("")
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
