"""The app's light and dark looks: the palette, the window's own colours, and restyling.

:func:`apply_theme` picks :data:`gui.style.LIGHT` or :data:`gui.style.DARK` (``"system"``
follows the desktop's colour scheme where Qt can read it, else light), sets the app's
palette to match and restyles every widget registered with :func:`keep_styled`. Widgets
that paint or format text read :func:`gui.style.colours` as they do, so the window's
parts that render documents (the chat, the comparison) re-render on
:meth:`gui.main_window.MainWindow`'s theme change.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette

from gui.style import DARK, LIGHT, Colours, colours, use_colours

if TYPE_CHECKING:
    from collections.abc import Callable

    from PySide6.QtWidgets import QApplication, QWidget

logger = logging.getLogger(__name__)

DARK_LIGHTNESS = 128  # a window colour darker than this (0-255) is a dark palette's
# The app's own palette, kept from before the first theme was applied: light's.
_light_palette: list[QPalette] = []
# Widgets whose style sheet names colours, and how to write it for a set of colours.
_styled: WeakKeyDictionary[QWidget, Callable[[Colours], str]] = WeakKeyDictionary()


def keep_styled(widget: QWidget, style: Callable[[Colours], str]) -> None:
    """Give ``widget`` the style sheet ``style`` writes, now and after every theme change."""
    _styled[widget] = style
    widget.setStyleSheet(style(colours()))


def text_colour(colour: str, extra: str = "") -> Callable[[Colours], str]:
    """A style sheet of text in the colour named ``colour``, plus ``extra`` rules.

    ``colour`` is a field of :class:`gui.style.Colours` (ValueError for another name).
    """
    if not isinstance(getattr(LIGHT, colour, None), QColor):
        raise ValueError(f"no colour named {colour!r}")
    return lambda chosen: f"color: {getattr(chosen, colour).name()};{' ' + extra if extra else ''}"


MUTED_TEXT_STYLE = text_colour("muted_text")
ERROR_TEXT_STYLE = text_colour("error_text")
NO_STYLE: Callable[[Colours], str] = lambda _chosen: ""  # noqa: E731


def system_is_dark() -> bool:
    """Does the desktop ask for dark colours? (False where Qt cannot tell.)"""
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def colours_for(choice: str) -> Colours:
    """The colours a theme choice (the setting ``theme``) means on this desktop."""
    if choice == "dark" or (choice == "system" and system_is_dark()):
        return DARK
    return LIGHT


DARK_WINDOW = QColor("#202124")


def dark_palette(chosen: Colours) -> QPalette:
    """The app's palette for dark colours: near-black surfaces, light text."""
    palette = QPalette()
    window = DARK_WINDOW
    base = chosen.answer_background
    text = chosen.title_text
    disabled_text = LIGHT.muted_text  # dimmer than dark's own muted text
    roles = {
        QPalette.ColorRole.Window: window,
        QPalette.ColorRole.WindowText: text,
        QPalette.ColorRole.Base: base,
        QPalette.ColorRole.AlternateBase: chosen.card_background,
        QPalette.ColorRole.ToolTipBase: chosen.card_background,
        QPalette.ColorRole.ToolTipText: text,
        QPalette.ColorRole.PlaceholderText: chosen.muted_text,
        QPalette.ColorRole.Text: text,
        QPalette.ColorRole.Button: QColor("#2b2d31"),
        QPalette.ColorRole.ButtonText: text,
        QPalette.ColorRole.BrightText: QColor("#ffffff"),
        QPalette.ColorRole.Light: QColor("#3a3d42"),
        QPalette.ColorRole.Midlight: QColor("#33363b"),
        QPalette.ColorRole.Mid: QColor("#2b2d31"),
        QPalette.ColorRole.Dark: QColor("#151618"),
        QPalette.ColorRole.Shadow: QColor("#000000"),
        QPalette.ColorRole.Highlight: QColor("#2f6fd6"),
        QPalette.ColorRole.HighlightedText: QColor("#ffffff"),
        QPalette.ColorRole.Link: chosen.link_text,
        QPalette.ColorRole.LinkVisited: QColor("#b392f0"),
    }
    for role, colour in roles.items():
        palette.setColor(role, colour)
    for role in (
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
    ):
        palette.setColor(QPalette.ColorGroup.Disabled, role, disabled_text)
    return palette


def apply_theme(app: QApplication, choice: str) -> bool:
    """Use the colours ``choice`` means, with a matching palette; True if they changed.

    Light is the palette the app had before the first call. Widgets registered with
    :func:`keep_styled` are restyled here; documents already rendered keep their colours
    until rendered again.
    """
    chosen = colours_for(choice)
    changed = chosen is not colours()
    use_colours(chosen)
    if not _light_palette:
        first = app.palette()
        dark_desktop = first.color(QPalette.ColorRole.Window).lightness() < DARK_LIGHTNESS
        # Under a dark desktop theme the app's own palette is dark: light is the style's.
        _light_palette.append(app.style().standardPalette() if dark_desktop else QPalette(first))
    app.setPalette(dark_palette(chosen) if chosen.dark else _light_palette[0])
    if changed:
        for widget, style in list(_styled.items()):
            try:
                widget.setStyleSheet(style(chosen))
            except RuntimeError:  # its C++ side is gone; the wrapper goes with the next GC
                _styled.pop(widget, None)
    logger.debug("theme %s: %s colours", choice, "dark" if chosen.dark else "light")
    return changed
