"""Slow subprocess runs of the suite, started when the session starts (on request) on the idle core.

Off unless ``SPECDECK_TEST_PRESTART=1`` (see :data:`PRESTART_ENV`): then each marked test
runs its command itself when it comes, as if this module were not there.

Some tests run one command in a process of its own that takes tens of seconds: a bench or
the GPU check on lavapipe (a Vulkan GPU emulated on the CPU), MLX on its one-threaded CPU
backend. The rest of the suite leaves about a third of a 2-core machine idle (user CPU
25 min 53 s in an 18 min 39 s run, AMD EPYC (without AMX), 2 cores, 2026-12-08), so those
commands start with the session, one after another at the lowest CPU priority
(``nice -n 19``): they take the time the other tests leave and barely delay them. A test
marked ``@pytest.mark.prestarted(command_of=...)`` takes its command's result from the
``prestarted`` fixture: at once when the run is over, after a wait while it runs, or by
running it itself, in the foreground, when the queue has not reached it yet. Every test
still checks its own run's output; only when the run happens moves.

``command_of`` is called once at the session's start with a new folder the command may
write in (under pytest's temporary folder of the session), and returns the
:class:`Command`, or ``None`` where the test cannot run here (its own skip marker says why).
A command without an environment of its own gets the session's at its start, never the
one a running test has set up (the window's tests set crash stages and data folders).

Each run is a process group of its own, so that ending it (the session over, a timeout)
ends the workers a bench starts too. The runs share the user's cache folder with the tests
(the exactness memory): a run and a test that record a probe at once may lose one record,
which costs a probe more later, never a wrong answer.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import pytest

REPO = Path(__file__).resolve().parent.parent
MARKER = "prestarted"
# Off unless set to 1: in a full run with the queue on (2026-12-08, AMD EPYC (without AMX),
# 2 cores, Zen 5) two window tests failed: a trial budget ran out before its draft's trial
# and a calibration judged the machine a slow device. Passed in the run before and alone.
PRESTART_ENV = "SPECDECK_TEST_PRESTART"
NICE = shutil.which("nice")  # coreutils; without it the runs wait for their tests
NODE_NAME_CHARACTERS = 40  # of a test's name in its scratch folder's name


@dataclass(frozen=True)
class Command:
    """A command a test runs in a process of its own: its environment (``None``: the
    session's at its start) and how long the test waits for it once it asks."""

    args: Sequence[str]
    env: Mapping[str, str] | None = None
    timeout: float = 600


@dataclass
class _Run:
    """One command's run: claimed by the queue or by its test, then its result or error."""

    command: Command
    started: bool = False
    process: subprocess.Popen[str] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: subprocess.CompletedProcess[str] | None = None
    error: BaseException | None = None


def _end_group(process: subprocess.Popen[str]) -> None:
    """Kills the run's process group (a bench's workers with it) and reaps the process."""
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class PrestartedRuns:
    """Runs commands one after another in a background thread, at the lowest priority."""

    def __init__(self, commands: Mapping[str, Command]) -> None:
        self._runs = {nodeid: _Run(command) for nodeid, command in commands.items()}
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="prestarted", daemon=True)

    def start(self) -> None:
        """Starts the queue, where there is one and ``nice`` to run it with."""
        if self._runs and NICE is not None:
            self._thread.start()

    def _claim(self, run: _Run, *, background: bool) -> bool:
        with self._lock:
            if run.started or (background and self._stopping):
                return False
            run.started = True
            return True

    def _work(self) -> None:
        for run in self._runs.values():
            if self._claim(run, background=True):
                self._run_to_end(run, [NICE or "nice", "-n", "19", *run.command.args], None)

    def _run_to_end(self, run: _Run, args: Sequence[str], timeout: float | None) -> None:
        """Runs ``args`` in a process group of its own and keeps what it printed."""
        env = None if run.command.env is None else dict(run.command.env)
        try:
            process = subprocess.Popen(
                list(args),
                env=env,
                cwd=REPO,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            with self._lock:
                run.process = process
                stopping = self._stopping and timeout is None
            if stopping:  # the session ended between the claim and the start
                _end_group(process)
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except BaseException:  # a timeout, pytest-timeout's alarm, Ctrl-C
                _end_group(process)
                raise
            run.result = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
        except BaseException as error:  # handed to the test, which reports it
            run.error = error
        finally:
            run.done.set()

    def has(self, nodeid: str) -> bool:
        """Whether test ``nodeid`` has a run here."""
        return nodeid in self._runs

    def command(self, nodeid: str) -> Command:
        """The command of test ``nodeid``, as it was queued."""
        return self._runs[nodeid].command

    def started(self, nodeid: str) -> bool:
        """Whether the run of ``nodeid`` has begun (in the queue or in its test)."""
        return self._runs[nodeid].started

    def result(self, nodeid: str) -> subprocess.CompletedProcess[str]:
        """The finished run of ``nodeid``'s command: waited for (at most its timeout from
        now), or run here if the queue has not reached it."""
        run = self._runs[nodeid]
        timeout = run.command.timeout
        if self._claim(run, background=False):
            self._run_to_end(run, run.command.args, timeout)
        elif not run.done.wait(timeout):
            process = run.process
            if process is not None:
                _end_group(process)  # communicate() returns, and the run is done
            run.done.wait()
            raise subprocess.TimeoutExpired(list(run.command.args), timeout)
        if run.error is not None:
            raise run.error
        assert run.result is not None
        return run.result

    def stop(self) -> None:
        """Starts nothing more and ends the run under way (the session is over)."""
        with self._lock:
            self._stopping = True
            running = [run.process for run in self._runs.values() if not run.done.is_set()]
        for process in running:
            if process is not None and process.poll() is None:
                _end_group(process)


@dataclass(frozen=True)
class CommandProblem:
    """Why a marked test's command could not be made; raised when the test asks for it."""

    error: BaseException


def commands_of(
    items: Sequence[pytest.Item], scratch_of: Callable[[str], Path]
) -> tuple[dict[str, Command], dict[str, CommandProblem]]:
    """The commands of the marked tests among ``items``, in the session's order, each in
    the session's environment unless it has its own and with a new folder of its own to
    write in (``scratch_of(name)``); and, apart, the problems of those that failed."""
    commands: dict[str, Command] = {}
    problems: dict[str, CommandProblem] = {}
    session_env = dict(os.environ)
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is None:
            continue
        try:
            command_of: Callable[[Path], Command | None] = marker.kwargs["command_of"]
            name = re.sub(r"\W", "_", item.name)[:NODE_NAME_CHARACTERS]
            command = command_of(scratch_of(name))
        except Exception as error:  # the test's own error, not the whole session's
            problems[item.nodeid] = CommandProblem(error)
            continue
        if command is not None:
            env = session_env if command.env is None else command.env
            commands[item.nodeid] = Command(command.args, env, command.timeout)
    return commands, problems
