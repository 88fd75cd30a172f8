"""The suite's background runs (tests/prestarted.py): in order at the lowest priority, in
the session's environment, run by the test itself when the queue has not reached it, and
ended (workers too) with the session or a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from tests.prestarted import NICE, Command, PrestartedRuns, commands_of

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

NICENESS = [sys.executable, "-c", "import os, time; print(os.nice(0), time.monotonic())"]
# Starts a child that sleeps 30 s and keeps the pipes open, as a bench's worker does.
WITH_A_SLEEPING_CHILD = [
    sys.executable,
    "-c",
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)",
]
QUICK = 10  # seconds: far below the 30 s the sleepers would take

needs_nice = pytest.mark.skipif(NICE is None, reason="no nice(1) here: nothing runs early")


@pytest.fixture
def started() -> Iterator[list[PrestartedRuns]]:
    """Queues made by a test; stopped at its end whatever it asserted."""
    made: list[PrestartedRuns] = []
    yield made
    for runs in made:
        runs.stop()


def wait_until_started(runs: PrestartedRuns, nodeid: str) -> None:
    deadline = time.monotonic() + QUICK
    while not runs.started(nodeid):
        assert time.monotonic() < deadline, f"{nodeid} never started"
        time.sleep(0.01)


@needs_nice
def test_queued_runs_go_in_order_at_the_lowest_priority(started: list[PrestartedRuns]) -> None:
    own_niceness = os.nice(0)
    runs = PrestartedRuns({name: Command(NICENESS) for name in ("first", "second", "third")})
    started.append(runs)
    runs.start()
    wait_until_started(runs, "third")  # else the test would run it, at its own priority
    printed = [runs.result(name).stdout.split() for name in ("third", "first", "second")]
    third, first, second = ((int(nice), float(clock)) for nice, clock in printed)
    assert first[0] == second[0] == third[0] == min(own_niceness + 19, 19)
    assert first[1] < second[1] < third[1]  # asked for last first, run in the queue's order


@needs_nice
def test_a_run_the_queue_has_not_reached_is_run_by_its_test(
    started: list[PrestartedRuns],
) -> None:
    runs = PrestartedRuns({"slow": Command(WITH_A_SLEEPING_CHILD), "mine": Command(NICENESS)})
    started.append(runs)
    runs.start()
    wait_until_started(runs, "slow")
    began = time.monotonic()
    mine = runs.result("mine")  # not behind "slow": run here, at the test's own priority
    assert int(mine.stdout.split()[0]) == os.nice(0)
    assert time.monotonic() - began < QUICK


@needs_nice
def test_the_session_s_end_ends_the_run_under_way_and_its_children() -> None:
    runs = PrestartedRuns({"slow": Command(WITH_A_SLEEPING_CHILD)})
    runs.start()
    wait_until_started(runs, "slow")
    time.sleep(0.5)  # the child is started
    began = time.monotonic()
    runs.stop()
    ended = runs.result("slow")  # the pipes closed: the child ended with its parent
    assert ended.returncode == -9
    assert time.monotonic() - began < QUICK


@needs_nice
def test_a_test_waits_for_its_run_no_longer_than_the_command_s_timeout() -> None:
    runs = PrestartedRuns({"slow": Command(WITH_A_SLEEPING_CHILD, timeout=1)})
    runs.start()
    wait_until_started(runs, "slow")
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        runs.result("slow")
    assert time.monotonic() - began < QUICK


def test_a_test_s_own_run_ends_at_its_timeout_children_too() -> None:
    runs = PrestartedRuns({"mine": Command(WITH_A_SLEEPING_CHILD, timeout=1)})
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        runs.result("mine")
    assert time.monotonic() - began < QUICK


def test_a_failed_start_is_the_test_s_error() -> None:
    runs = PrestartedRuns({"missing": Command(["/nonexistent/command"])})
    with pytest.raises(FileNotFoundError):
        runs.result("missing")


def test_commands_get_the_session_s_environment_and_their_problems_go_to_their_tests(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window test's crash stage, set while a run is queued, never reaches the run; a
    command that could not be made is its own test's error, not every test's."""
    items = pytester.getitems(
        """
        import pytest
        from tests.prestarted import Command

        @pytest.mark.prestarted(command_of=lambda scratch: Command(["true", str(scratch)]))
        def test_queued(prestarted): pass

        @pytest.mark.prestarted(command_of=lambda scratch: Command(["x"], env={"A": "1"}))
        def test_own_environment(prestarted): pass

        @pytest.mark.prestarted(command_of=lambda scratch: None)
        def test_cannot_run_here(prestarted): pass

        @pytest.mark.prestarted(command_of=lambda scratch: 1 / 0)
        def test_broken(prestarted): pass

        def test_unmarked(): pass
        """
    )
    scratches: list[str] = []

    def scratch_of(name: str) -> Path:
        scratches.append(name)
        return tmp_path / name

    monkeypatch.delenv("SPECDECK_CRASH_AT", raising=False)
    commands, problems = commands_of(items, scratch_of)
    monkeypatch.setenv("SPECDECK_CRASH_AT", "draft-model")  # as a window test does, later
    names = [nodeid.split("::")[-1] for nodeid in commands]
    assert names == ["test_queued", "test_own_environment"]
    queued, own = commands.values()
    assert queued.env is not None
    assert "SPECDECK_CRASH_AT" not in queued.env
    assert queued.env["PATH"] == os.environ["PATH"]
    assert own.env == {"A": "1"}
    assert list(queued.args) == ["true", str(tmp_path / "test_queued")]
    ((broken, problem),) = problems.items()
    assert broken.endswith("::test_broken")
    assert isinstance(problem.error, ZeroDivisionError)
    assert "test_unmarked" not in scratches
