"""Run one blocking function off the GUI thread and hear about it through queued signals."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from backends.errors import SpecDeckError

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)


class BackgroundTask(QObject):
    """Calls ``work(report)`` on a worker thread; ``report(x)`` emits ``progress(x)``.

    The signals are emitted from the worker thread and delivered queued on the thread this
    object lives in (the GUI thread), so slots may touch widgets.

    Signals:
        progress(object): whatever the work reported.
        succeeded(object): the work's return value.
        failed(str): a one-line message (SpecDeckError's text, or the exception's type).
    """

    progress = Signal(object)
    succeeded = Signal(object)
    failed = Signal(str)

    def __init__(
        self, work: Callable[[Callable[[object], None]], Any], parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self._work = work
        self._thread: threading.Thread | None = None
        self.cancelled = threading.Event()

    def start(self) -> None:
        """Start the work (once)."""
        if self._thread is not None:
            raise RuntimeError("a BackgroundTask runs once")
        self._thread = threading.Thread(target=self._run, name="background-task", daemon=True)
        self._thread.start()

    def running(self) -> bool:
        """Whether the worker thread is still going."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the work ends (for shutdown and tests); True if it did."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running()

    def _run(self) -> None:
        try:
            result = self._work(self.progress.emit)
        except SpecDeckError as error:
            self.failed.emit(str(error))
        except Exception as error:  # the message reaches the window, not a traceback dialog
            log.exception("background task failed")
            self.failed.emit(f"{type(error).__name__}: {error}")
        else:
            self.succeeded.emit(result)
