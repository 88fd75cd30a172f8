"""How the chat looks: the formats of labels, bubbles and footers, the footer's words, the column.

:class:`ChatStyles` holds the text formats :class:`gui.chat_pane.ChatPane` writes with;
:func:`footer_parts` and :func:`stats_summary` say what an answer's footer reads;
:class:`ChatBrowser` keeps the text a readable column on wide windows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QTextBlockFormat, QTextCharFormat, QTextFrameFormat

from gui.answer_text import AnswerBrowser, AnswerStyles, scaled_point_size
from gui.style import colours

if TYPE_CHECKING:
    from PySide6.QtGui import QResizeEvent

    from backends.speculation.types import SpeculationStats
    from gui.transcript import MessageState

FOOTER_SEPARATOR = " · "
CANCELLED_TEXT = "Stopped"
INTERRUPTED_TEXT = "Interrupted (the app closed while answering)"
ERROR_TITLE = "Error"
ERROR_PREFIX = f"{ERROR_TITLE}: "
NO_DRAFTS_TEXT = "no drafts"

STOP_REASON_WORDS = {
    "eos": "end of answer",
    "max_tokens": "max tokens",
    "cancelled": "stopped",
    "stop_string": "stop string",
    "context_full": "context full",
}


DOCUMENT_MARGIN = 18
MAX_COLUMN_WIDTH = 880  # wider lines are hard to read
MESSAGE_TOP_MARGIN = 18  # space between one message and the next
LABEL_BOTTOM_MARGIN = 4
BUBBLE_PADDING = 10
BUBBLE_BORDER_WIDTH = 1
BUBBLE_BOTTOM_MARGIN = 14
FOOTER_TOP_MARGIN = 8
NOTICE_TOP_MARGIN = 14
SMALL_POINT_SCALE = 0.88


def stats_summary(stats: SpeculationStats) -> str:
    """One line of figures: speed, first token, tokens, drafts, acceptance, why it stopped."""
    parts = [f"{stats.tokens_per_second:.1f} tok/s"]
    if stats.time_to_first_token_sec is not None:
        parts.append(f"{stats.time_to_first_token_sec:.2f} s to first token")
    parts.append(f"{stats.generated_tokens} tokens")
    rate = stats.acceptance_rate
    if rate is None:
        parts.append(NO_DRAFTS_TEXT)
    else:
        parts.append(
            f"drafted {stats.total_draft_tokens_count} / "
            f"accepted {stats.accepted_draft_tokens_count} / "
            f"rejected {stats.rejected_draft_tokens_count}"
        )
        parts.append(f"{rate * 100:.0f}% accepted")
    if stats.stop_reason is not None:
        parts.append(STOP_REASON_WORDS.get(stats.stop_reason, stats.stop_reason))
    if stats.dropped_messages:
        count = stats.dropped_messages
        parts.append(
            f"{count} earlier message{'s' if count != 1 else ''} left out to fit the context"
        )
    return FOOTER_SEPARATOR.join(parts)


def footer_parts(
    stats: SpeculationStats | None, state: MessageState, error: str | None
) -> tuple[str, str]:
    """(error text, muted text) of an answer's footer; either may be empty."""
    error_text = ""
    if state == "error":
        error_text = f"{ERROR_PREFIX}{error}" if error else ERROR_TITLE
    muted: list[str] = []
    if state == "cancelled":
        muted.append(CANCELLED_TEXT)
    elif state == "interrupted":
        muted.append(INTERRUPTED_TEXT)
    if stats is not None:
        summary = stats_summary(stats)
        if state == "cancelled" and stats.stop_reason == "cancelled":
            summary = summary.removesuffix(FOOTER_SEPARATOR + STOP_REASON_WORDS["cancelled"])
        muted.append(summary)
    return error_text, FOOTER_SEPARATOR.join(muted)


class ChatStyles(AnswerStyles):
    """The formats of the chat: answer text, labels, bubbles and footers."""

    def __init__(self, base_font: QFont, visualize_drafts: bool) -> None:
        super().__init__(base_font, visualize_drafts)
        self.label_block = QTextBlockFormat()
        self.label_block.setTopMargin(MESSAGE_TOP_MARGIN)
        self.label_block.setBottomMargin(LABEL_BOTTOM_MARGIN)
        self.bubble_label_block = QTextBlockFormat()
        self.bubble_label_block.setBottomMargin(LABEL_BOTTOM_MARGIN)
        self.footer_block = QTextBlockFormat()
        self.footer_block.setTopMargin(FOOTER_TOP_MARGIN)
        self.collapsed_block = QTextBlockFormat()
        self.collapsed_block.setLineHeight(0, QTextBlockFormat.LineHeightTypes.FixedHeight.value)
        self.notice_block = QTextBlockFormat()
        self.notice_block.setTopMargin(NOTICE_TOP_MARGIN)
        self.notice_block.setAlignment(Qt.AlignmentFlag.AlignHCenter)

        self.label = QTextCharFormat()
        self.label.setFontWeight(QFont.Weight.DemiBold)
        self.label.setForeground(colours().label_text)
        self.label_method = QTextCharFormat()
        self.label_method.setForeground(colours().muted_text)
        self.body = QTextCharFormat()
        self.footer = QTextCharFormat()
        self.footer.setForeground(colours().muted_text)
        self.footer.setFontPointSize(scaled_point_size(base_font, SMALL_POINT_SCALE))
        self.footer_error = QTextCharFormat(self.footer)
        self.footer_error.setForeground(colours().error_text)
        self.notice = QTextCharFormat(self.footer)
        self.notice.setFontItalic(True)

        self.bubble = QTextFrameFormat()
        self.bubble.setBackground(colours().user_bubble_background)
        self.bubble.setPadding(BUBBLE_PADDING)
        self.bubble.setTopMargin(MESSAGE_TOP_MARGIN)
        # A block's top margin is not kept after a frame, so the bubble keeps the distance.
        self.bubble.setBottomMargin(BUBBLE_BOTTOM_MARGIN)
        self.bubble.setBorder(BUBBLE_BORDER_WIDTH)
        self.bubble.setBorderBrush(colours().user_bubble_border)
        self.bubble.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)


class ChatBrowser(AnswerBrowser):
    """The chat's answer browser; on wide windows the text stays a readable column in the middle.

    Signals: none of its own.
    """

    def resizeEvent(self, event: QResizeEvent) -> None:
        """Keep the text column centred and at most ``MAX_COLUMN_WIDTH`` wide."""
        self.update_column_margins()
        super().resizeEvent(event)

    def update_column_margins(self) -> None:
        """Centre the text column of the current width."""
        width = self.viewport().width()
        side = max(DOCUMENT_MARGIN, (width - MAX_COLUMN_WIDTH) // 2)
        root = self.document().rootFrame()
        frame_format = root.frameFormat()
        if frame_format.leftMargin() == side and frame_format.rightMargin() == side:
            return
        frame_format.setLeftMargin(side)
        frame_format.setRightMargin(side)
        root.setFrameFormat(frame_format)
