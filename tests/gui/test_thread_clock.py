"""The event-loop test's clock: a thread's wait for a CPU is told apart from its sleeping."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from tests.gui.thread_clock import ThreadClock

# A process on one CPU that says it is ready, then spins until killed.
SPINNER = "import os\nos.sched_setaffinity(0, {%d})\nprint(flush=True)\nwhile True: pass\n"


@pytest.fixture
def thread_clock() -> ThreadClock:
    clock = ThreadClock()
    if not clock.measures_waiting:
        pytest.skip("this kernel does not report a thread's run-queue wait")
    return clock


def test_a_sleeping_thread_is_not_waiting_for_a_cpu(thread_clock: ThreadClock) -> None:
    before = thread_clock.waited_ns()
    time.sleep(0.15)
    assert (thread_clock.waited_ns() - before) / 1e6 < 30


def test_a_thread_crowded_off_its_cpu_is_waiting(thread_clock: ThreadClock) -> None:
    """Two processes spinning on this thread's only CPU take about two thirds of its time."""
    cpu = min(os.sched_getaffinity(0))
    saved = os.sched_getaffinity(0)
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPINNER % cpu], stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    try:
        for spinner in spinners:
            assert spinner.stdout is not None
            spinner.stdout.readline()
        os.sched_setaffinity(0, {cpu})
        before = thread_clock.waited_ns()
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            pass
        waited_ms = (thread_clock.waited_ns() - before) / 1e6
    finally:
        os.sched_setaffinity(0, saved)
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert waited_ms > 100, f"waited {waited_ms:.0f} ms of 300 beside two spinners on CPU {cpu}"


def test_the_clock_is_read_on_its_own_thread(thread_clock: ThreadClock) -> None:
    errors: list[BaseException] = []

    def read() -> None:
        try:
            thread_clock.waited_ns()
        except RuntimeError as error:
            errors.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join()
    assert len(errors) == 1
