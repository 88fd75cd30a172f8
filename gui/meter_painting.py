"""The meter's painted parts: the acceptance gauge and the bars of acceptance per position.

Both are plain QWidgets that draw themselves with QPainter; :mod:`gui.meter` lays them out
with the figures beside them and feeds them values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from gui.style import colours

if TYPE_CHECKING:
    from PySide6.QtGui import QPaintEvent

    from gui.style import Colours

GOOD_ACCEPTANCE = 0.6  # at or above: the draft is clearly paying for itself
WARN_ACCEPTANCE = 0.3  # below: most drafted tokens are wasted work

NO_VALUE = "—"
NO_DRAFTS_TEXT = "No drafts yet"
SMALL_POINT_SCALE = 0.85  # captions and bar labels, against the widget's own font


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


def acceptance_colour(value: float, chosen: Colours | None = None) -> QColor:
    """Good, warn or bad (of ``chosen``, else the colours in use) for a share in [0, 1]."""
    chosen = chosen or colours()
    if value >= GOOD_ACCEPTANCE:
        return chosen.good
    if value >= WARN_ACCEPTANCE:
        return chosen.warn
    return chosen.bad


def percent_text(value: float | None) -> str:
    """``0.823`` as ``"82%"``, None as a dash."""
    return NO_VALUE if value is None else f"{value * 100:.0f}%"


def scaled_font(base: QFont, scale: float, *, bold: bool = False) -> QFont:
    """``base`` at ``scale`` times its point size, bold or not."""
    font = QFont(base)
    font.setPointSizeF(base.pointSizeF() * scale)
    font.setBold(bold)
    return font


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
        small_font = scaled_font(self.font(), SMALL_POINT_SCALE)
        caption_height = QFontMetrics(small_font).height()
        margin = GAUGE_PEN_WIDTH / 2 + 2
        # The arc's lowest points are at 3/4 of its circle's diameter; the caption sits
        # under them, so the circle fits the height left once the caption has its row.
        room_for_arc = self.height() - margin - GAUGE_PEN_WIDTH / 2 - caption_height
        diameter = max(0.0, min(self.width() - 2 * margin, room_for_arc / ARC_HEIGHT_SHARE))
        left = (self.width() - diameter) / 2
        arc_rect = QRectF(left, margin, diameter, diameter)

        track_pen = QPen(colours().subtle_line, GAUGE_PEN_WIDTH)
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

        value_font = scaled_font(self.font(), GAUGE_VALUE_POINT_SCALE, bold=True)
        painter.setFont(value_font)
        painter.setPen(colours().value_text if self._value is not None else colours().muted_text)
        value_height = painter.fontMetrics().height()
        value_rect = QRectF(
            arc_rect.left(), arc_rect.center().y() - value_height / 2, diameter, value_height
        )
        painter.drawText(value_rect, Qt.AlignmentFlag.AlignCenter, self.value_text())

        painter.setFont(small_font)
        painter.setPen(colours().muted_text)
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
        small_font = scaled_font(self.font(), SMALL_POINT_SCALE)
        painter.setFont(small_font)
        if not self._values:
            painter.setPen(colours().muted_text)
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
                empty_pen = QPen(colours().empty_bar, 1.0, Qt.PenStyle.DashLine)
                painter.setPen(empty_pen)
                painter.setBrush(Qt.BrushStyle.NoBrush)
                painter.drawRoundedRect(
                    track.adjusted(0.5, 0.5, -0.5, -0.5), BAR_CORNER_RADIUS, BAR_CORNER_RADIUS
                )
            else:
                painter.setPen(Qt.PenStyle.NoPen)
                painter.setBrush(colours().subtle_line)
                painter.drawRoundedRect(track, BAR_CORNER_RADIUS, BAR_CORNER_RADIUS)
                filled_height = full_height * min(max(value, 0.0), 1.0)
                if filled_height > 0.0:
                    painter.setBrush(acceptance_colour(value))
                    filled = QRectF(bar_left, bottom - filled_height, bar_width, filled_height)
                    painter.drawRoundedRect(filled, BAR_CORNER_RADIUS, BAR_CORNER_RADIUS)
            painter.setPen(colours().muted_text)
            position = index + 1
            label = f"pos {position}" if slot >= LONG_LABEL_MIN_SLOT else str(position)
            label_rect = QRectF(slot * index, bottom, slot, BAR_LABEL_HEIGHT)
            painter.drawText(label_rect, Qt.AlignmentFlag.AlignCenter, label)
            if show_percent:
                percent_rect = QRectF(slot * index, 0, slot, BAR_LABEL_HEIGHT)
                painter.drawText(percent_rect, Qt.AlignmentFlag.AlignCenter, percent_text(value))
        painter.end()
