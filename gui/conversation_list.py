"""The sidebar's list of chats: a model over the history, and the list with new/rename/delete."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from PySide6.QtCore import (
    QAbstractListModel,
    QItemSelection,
    QItemSelectionModel,
    QModelIndex,
    QPersistentModelIndex,
    QRect,
    QSize,
    Qt,
    Signal,
    Slot,
)
from PySide6.QtGui import QAction, QFont, QFontMetrics, QKeySequence, QPainter, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QMenu,
    QMessageBox,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from gui.style import colours

if TYPE_CHECKING:
    from PySide6.QtCore import QPoint

    from gui.chat_store import ChatStore, ConversationSummary

ConversationIdRole: Final = Qt.ItemDataRole.UserRole + 1
UpdatedRole: Final = Qt.ItemDataRole.UserRole + 2

NEW_CHAT_TOOLTIP = "New chat (Ctrl+N)"
SEARCH_PLACEHOLDER = "Search chats"
EXPORT_MARKDOWN_ACTION = "Export as Markdown…"
EXPORT_JSON_ACTION = "Export as JSON…"
ROW_PADDING_X = 10
ROW_PADDING_Y = 7
ROW_GAP = 2  # between two chats' highlight boxes
LINE_GAP = 2  # between a chat's title and its date
ROW_CORNER_RADIUS = 6
DATE_POINT_SIZE_RATIO = 0.85
_AnyIndex = QModelIndex | QPersistentModelIndex


def relative_date(epoch: float, now: float | None = None) -> str:
    """A short local date: "today 14:03", "yesterday", "Monday", "12 Mar" or "12 Mar 2023"."""
    when = datetime.fromtimestamp(epoch)
    today = datetime.fromtimestamp(time.time() if now is None else now).date()
    day = when.date()
    if day == today:
        return f"today {when:%H:%M}"
    if day == today - timedelta(days=1):
        return "yesterday"
    if today - timedelta(days=7) < day < today:
        return f"{when:%A}"
    if day.year == today.year:
        return f"{when.day} {when:%b}"
    return f"{when.day} {when:%b %Y}"


class ConversationListModel(QAbstractListModel):
    """The conversations of a :class:`ChatStore`, most recently updated first.

    Emits the standard model signals; ``setData`` with the edit role renames in the store.
    """

    def __init__(self, store: ChatStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._store = store
        self._search = ""
        self._conversations: list[ConversationSummary] = store.list_conversations()

    @property
    def store(self) -> ChatStore:
        """The history this model shows."""
        return self._store

    def refresh(self) -> None:
        """Reload the conversations from the store (those the search finds, if any)."""
        self.beginResetModel()
        self._conversations = self._store.search_conversations(self._search)
        self.endResetModel()

    def set_search(self, text: str) -> None:
        """Show only the conversations whose title or messages hold ``text`` ("" for all)."""
        self._search = text
        self.refresh()

    def rowCount(self, parent: _AnyIndex = QModelIndex()) -> int:  # noqa: B008
        """How many conversations there are (a list: no children)."""
        return 0 if parent.isValid() else len(self._conversations)

    def data(self, index: _AnyIndex, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        """Title for display and editing, id and update time for the custom roles."""
        if not index.isValid() or not 0 <= index.row() < len(self._conversations):
            return None
        conversation = self._conversations[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return conversation.title
        if role == Qt.ItemDataRole.ToolTipRole:
            return conversation.title
        if role == ConversationIdRole:
            return conversation.conversation_id
        if role == UpdatedRole:
            return conversation.updated_at
        return None

    def setData(
        self, index: _AnyIndex, value: object, role: int = Qt.ItemDataRole.EditRole
    ) -> bool:
        """Rename a conversation in the store (blank titles are refused)."""
        if role != Qt.ItemDataRole.EditRole or not index.isValid():
            return False
        title = " ".join(str(value).split())
        if not title:
            return False
        conversation = self._conversations[index.row()]
        if title == conversation.title:
            return True
        self._store.rename_conversation(conversation.conversation_id, title)
        self._conversations[index.row()] = replace(conversation, title=title)
        self.dataChanged.emit(index, index, [Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole])
        return True

    def flags(self, index: _AnyIndex) -> Qt.ItemFlag:
        """Selectable, enabled and editable (inline rename)."""
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return super().flags(index) | Qt.ItemFlag.ItemIsEditable

    def row_of(self, conversation_id: int) -> int:
        """The row of a conversation, -1 if it is not listed."""
        for row, conversation in enumerate(self._conversations):
            if conversation.conversation_id == conversation_id:
                return row
        return -1

    def conversation_id(self, row: int) -> int:
        """The id of the conversation in ``row``."""
        return self._conversations[row].conversation_id


class ConversationDelegate(QStyledItemDelegate):
    """Paints a chat as its title over a muted relative date, on a rounded highlight."""

    def _date_font(self, option: QStyleOptionViewItem) -> QFont:
        font = QFont(option.font)
        font.setPointSizeF(font.pointSizeF() * DATE_POINT_SIZE_RATIO)
        return font

    def _title_rect(self, option: QStyleOptionViewItem) -> QRect:
        box = option.rect.adjusted(0, 0, 0, -ROW_GAP)
        height = QFontMetrics(option.font).height()
        inner = box.adjusted(ROW_PADDING_X, ROW_PADDING_Y, -ROW_PADDING_X, 0)
        return QRect(inner.left(), inner.top(), inner.width(), height)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: _AnyIndex) -> None:
        """Highlight, title (elided) and date."""
        state = option.state
        box = option.rect.adjusted(0, 0, 0, -ROW_GAP)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        background = None
        if state & QStyle.StateFlag.State_Selected:
            background = colours().subtle_line
        elif state & QStyle.StateFlag.State_MouseOver:
            background = colours().hover_background
        if background is not None:
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(background)
            painter.drawRoundedRect(box, ROW_CORNER_RADIUS, ROW_CORNER_RADIUS)

        title_rect = self._title_rect(option)
        title_font = QFont(option.font)
        if state & QStyle.StateFlag.State_Selected:
            title_font.setWeight(QFont.Weight.DemiBold)
        title_metrics = QFontMetrics(title_font)
        title = title_metrics.elidedText(
            str(index.data(Qt.ItemDataRole.DisplayRole)),
            Qt.TextElideMode.ElideRight,
            title_rect.width(),
        )
        painter.setFont(title_font)
        painter.setPen(QPen(colours().title_text))
        painter.drawText(
            title_rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, title
        )

        updated = index.data(UpdatedRole)
        if isinstance(updated, float):
            date_font = self._date_font(option)
            date_rect = QRect(
                title_rect.left(),
                title_rect.bottom() + 1 + LINE_GAP,
                title_rect.width(),
                QFontMetrics(date_font).height(),
            )
            painter.setFont(date_font)
            painter.setPen(QPen(colours().muted_text))
            painter.drawText(
                date_rect,
                Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                relative_date(updated),
            )
        painter.restore()

    def sizeHint(self, option: QStyleOptionViewItem, index: _AnyIndex) -> QSize:
        """Two lines of text with padding."""
        title_height = QFontMetrics(option.font).height()
        date_height = QFontMetrics(self._date_font(option)).height()
        height = ROW_PADDING_Y * 2 + title_height + LINE_GAP + date_height + ROW_GAP
        return QSize(option.rect.width(), height)

    def updateEditorGeometry(
        self, editor: QWidget, option: QStyleOptionViewItem, index: _AnyIndex
    ) -> None:
        """The rename field sits over the title line."""
        title_rect = self._title_rect(option)
        editor.setGeometry(title_rect.adjusted(-3, -3, 3, 3))


class ConversationList(QWidget):
    """The chats: a "New chat" button over the list; rename and delete from a context menu.

    Signals:
        conversation_selected(int): the user picked a chat (not emitted by :meth:`select`).
        new_chat_requested(): the "New chat" button or Ctrl+N.
        conversation_deleted(int): a chat was deleted from the history. If it was the selected
            one, the next chat is then selected (with ``conversation_selected``); when none is
            left nothing is selected.
        export_requested(int, str): the context menu's Export as Markdown or JSON.

    The search box over the list keeps the chats whose title or messages hold its text.
    """

    conversation_selected = Signal(int)
    new_chat_requested = Signal()
    conversation_deleted = Signal(int)
    export_requested = Signal(int, str)  # the chat, "markdown" or "json"

    def __init__(self, store: ChatStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = ConversationListModel(store, self)
        self._restoring_selection = False
        self._selected_before_reset: int | None = None

        self.new_chat_button = QPushButton("New chat")
        self.new_chat_button.setToolTip(NEW_CHAT_TOOLTIP)
        self.new_chat_button.clicked.connect(self.new_chat_requested)
        heading = QLabel("Chats")
        heading_font = heading.font()
        heading_font.setWeight(QFont.Weight.DemiBold)
        heading.setFont(heading_font)

        self.search = QLineEdit()
        self.search.setPlaceholderText(SEARCH_PLACEHOLDER)
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.model.set_search)

        self.view = QListView()
        self.view.setModel(self.model)
        self.view.setItemDelegate(ConversationDelegate(self.view))
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed)
        self.view.setFrameShape(QListView.Shape.NoFrame)
        self.view.setMouseTracking(True)  # hover highlight
        self.view.setUniformItemSizes(True)
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._show_context_menu)
        self.view.selectionModel().selectionChanged.connect(self._on_selection_changed)
        self.model.modelAboutToBeReset.connect(self._remember_selection)
        self.model.modelReset.connect(self._restore_selection)

        self.new_chat_action = QAction("New chat", self)
        self.new_chat_action.setShortcut(QKeySequence.StandardKey.New)
        self.new_chat_action.triggered.connect(self.new_chat_requested)
        self.rename_action = QAction("Rename", self)
        self.rename_action.setShortcut(QKeySequence(Qt.Key.Key_F2))
        self.rename_action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.rename_action.triggered.connect(self._rename_current)
        self.delete_action = QAction("Delete…", self)
        self.delete_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Delete))
        self.delete_action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.delete_action.triggered.connect(self._delete_current)
        self.addActions([self.new_chat_action, self.rename_action, self.delete_action])

        header = QHBoxLayout()
        header.setContentsMargins(ROW_PADDING_X, 0, 0, 0)
        header.addWidget(heading)
        header.addStretch(1)
        header.addWidget(self.new_chat_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.setSpacing(8)
        layout.addLayout(header)
        layout.addWidget(self.search)
        layout.addWidget(self.view, 1)
        self._update_actions()

    # -- public ------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Reload from the store (after a message, an answer or a new chat), keeping selection."""
        self.model.refresh()

    def select(self, conversation_id: int | None) -> None:
        """Select a chat without emitting ``conversation_selected`` (None clears the selection)."""
        self._restoring_selection = True
        try:
            row = -1 if conversation_id is None else self.model.row_of(conversation_id)
            if row < 0:
                self.view.selectionModel().clear()
            else:
                index = self.model.index(row)
                self.view.selectionModel().setCurrentIndex(index, self._select_flags())
                self.view.scrollTo(index)
        finally:
            self._restoring_selection = False
        self._update_actions()

    def selected_conversation_id(self) -> int | None:
        """The selected chat's id, None when nothing is selected."""
        rows = self.view.selectionModel().selectedRows()
        return self.model.conversation_id(rows[0].row()) if rows else None

    def rename_conversation(self, conversation_id: int) -> None:
        """Start editing a chat's title in place."""
        row = self.model.row_of(conversation_id)
        if row >= 0:
            self.view.setFocus()
            self.view.edit(self.model.index(row))

    def delete_conversation(self, conversation_id: int, confirm: bool = True) -> bool:
        """Delete a chat (after asking, unless ``confirm`` is False); True if it was deleted."""
        if confirm and not self._confirm_delete(conversation_id):
            return False
        was_selected = self.selected_conversation_id() == conversation_id
        old_row = self.model.row_of(conversation_id)
        self.model.store.delete_conversation(conversation_id)
        self.refresh()
        self.conversation_deleted.emit(conversation_id)
        if was_selected and self.model.rowCount() > 0:
            row = min(max(old_row, 0), self.model.rowCount() - 1)
            self.view.selectionModel().setCurrentIndex(self.model.index(row), self._select_flags())
        self._update_actions()
        return True

    # -- slots -------------------------------------------------------------------------------

    @Slot(QItemSelection, QItemSelection)
    def _on_selection_changed(self, selected: QItemSelection, _deselected: QItemSelection) -> None:
        self._update_actions()
        if self._restoring_selection or selected.isEmpty():
            return
        self.conversation_selected.emit(self.model.conversation_id(selected.indexes()[0].row()))

    @Slot()
    def _remember_selection(self) -> None:
        self._selected_before_reset = self.selected_conversation_id()

    @Slot()
    def _restore_selection(self) -> None:
        self.select(self._selected_before_reset)

    @Slot()
    def _update_actions(self) -> None:
        has_selection = self.selected_conversation_id() is not None
        self.rename_action.setEnabled(has_selection)
        self.delete_action.setEnabled(has_selection)

    @Slot()
    def _rename_current(self) -> None:
        conversation_id = self.selected_conversation_id()
        if conversation_id is not None:
            self.rename_conversation(conversation_id)

    @Slot()
    def _delete_current(self) -> None:
        conversation_id = self.selected_conversation_id()
        if conversation_id is not None:
            self.delete_conversation(conversation_id)

    @Slot("QPoint")
    def _show_context_menu(self, position: QPoint) -> None:
        index = self.view.indexAt(position)
        if not index.isValid():
            return
        conversation_id = self.model.conversation_id(index.row())
        menu = QMenu(self)
        rename = menu.addAction("Rename")
        export_markdown = menu.addAction(EXPORT_MARKDOWN_ACTION)
        export_json = menu.addAction(EXPORT_JSON_ACTION)
        delete = menu.addAction("Delete…")
        chosen = menu.exec(self.view.viewport().mapToGlobal(position))
        if chosen is rename:
            self.rename_conversation(conversation_id)
        elif chosen is export_markdown:
            self.export_requested.emit(conversation_id, "markdown")
        elif chosen is export_json:
            self.export_requested.emit(conversation_id, "json")
        elif chosen is delete:
            self.delete_conversation(conversation_id)

    # -- helpers -----------------------------------------------------------------------------

    def _confirm_delete(self, conversation_id: int) -> bool:
        title = self.model.store.conversation_title(conversation_id)
        answer = QMessageBox.question(
            self,
            "Delete chat",
            f"Delete “{title}” and all its messages? This cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No,
        )
        return answer == QMessageBox.StandardButton.Yes

    @staticmethod
    def _select_flags() -> QItemSelectionModel.SelectionFlag:
        return (
            QItemSelectionModel.SelectionFlag.ClearAndSelect
            | QItemSelectionModel.SelectionFlag.Current
        )


__all__ = [
    "ConversationDelegate",
    "ConversationIdRole",
    "ConversationList",
    "ConversationListModel",
    "UpdatedRole",
    "relative_date",
]
