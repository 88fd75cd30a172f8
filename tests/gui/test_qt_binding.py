"""The installed Qt binding must not leak references: a known PySide6 bug aborts Python 3.11."""

from __future__ import annotations

import sys

from PySide6.QtCore import QTimer

CALLS = 2000


def test_void_qt_calls_keep_none_alive() -> None:
    # PySide6 6.12.0 drops one reference to None per call of a method returning void; on
    # Python < 3.12 (None is not immortal there) the interpreter dies after a few thousand
    # streamed tokens with "Fatal Python error: none_dealloc".
    timer = QTimer()
    before = sys.getrefcount(None)
    for _ in range(CALLS):
        timer.setInterval(5)
    assert sys.getrefcount(None) >= before - CALLS // 100
