"""The suite's background runs (tests/prestarted.py): at the lowest priority in order, run
by the test itself when the queue has not reached it, ended with the session."""

from __future__ import annotations

import os
import sys
import time

import pytest

from tests.prestarted import NICE, Command, PrestartedRuns

NICENESS = [sys.executable, "-c", "import os; print(os.nice(0))"]

needs_nice = pytest.mark.skipif(NICE is None, reason="no nice(1) here: nothing runs early")


@needs_nice
def test_started_runs_go_in_order_at_the_lowest_priority() -> None:
    before = int(PrestartedRuns({"own": Command(NICENESS)}).result("own").stdout)
    runs = PrestartedRuns({"first": Command(NICENESS), "second": Command(NICENESS)})
    runs.start()
    first, second = runs.result("first"), runs.result("second")
    assert (first.returncode, second.returncode) == (0, 0)
    assert int(first.stdout) == int(second.stdout) == min(before + 19, 19)


@needs_nice
def test_a_run_the_queue_has_not_reached_is_run_by_its_test() -> None:
    slow = [sys.executable, "-c", "import time; time.sleep(30)"]
    runs = PrestartedRuns({"slow": Command(slow), "mine": Command([*NICENESS])})
    runs.start()
    while not runs.started("slow"):
        time.sleep(0.01)
    began = time.monotonic()
    mine = runs.result("mine")  # not behind "slow": run here, at the test's own priority
    assert time.monotonic() - began < 20
    assert int(mine.stdout) == os.nice(0)  # this process's own priority
    runs.stop()
    killed = runs.result("slow")  # ended with the session, not after its 30 s
    assert killed.returncode != 0
    assert time.monotonic() - began < 20


def test_a_failed_start_is_the_test_s_error() -> None:
    runs = PrestartedRuns({"missing": Command(["/nonexistent/command"])})
    with pytest.raises(FileNotFoundError):
        runs.result("missing")
