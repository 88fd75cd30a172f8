"""Where one thread's wall time went: its own work (running or blocked), or waiting for a CPU.

The event-loop test asks whether SpecDeck's GUI thread ever holds up its event loop. On a
2-core machine whose cores the engine process (and, in CI, whatever runs beside the tests)
keeps busy, the kernel may leave the GUI thread runnable but not running for a while; that
wait is the machine's, not the window's. Linux counts it per thread in
``/proc/self/task/<tid>/schedstat`` (nanoseconds running, nanoseconds waiting on a run
queue, time slices), so a gap in the event loop can be split into the two. Elsewhere the
wait reads as zero and the whole gap is charged to the thread.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


class ThreadClock:
    """The run-queue wait of the thread that made it, read from the kernel's scheduler stats."""

    def __init__(self) -> None:
        self._thread_id = threading.get_native_id()
        path = Path(f"/proc/self/task/{self._thread_id}/schedstat")
        self._fd: int | None = os.open(path, os.O_RDONLY) if path.exists() else None

    @property
    def measures_waiting(self) -> bool:
        """Whether this kernel reports the thread's wait for a CPU (Linux does)."""
        return self._fd is not None

    def waited_ns(self) -> int:
        """Nanoseconds the thread has spent runnable but not running, since it started."""
        if threading.get_native_id() != self._thread_id:
            raise RuntimeError("a ThreadClock is read on the thread that made it")
        if self._fd is None:
            return 0
        fields = os.pread(self._fd, 128, 0).split()
        return int(fields[1])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
