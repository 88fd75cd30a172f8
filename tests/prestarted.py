"""Slow subprocess runs of the suite, started when the session starts, on the idle core.

Some tests run one command in a process of its own that takes tens of seconds: a bench or
the GPU check on lavapipe (a Vulkan GPU emulated on the CPU), MLX on its one-threaded CPU
backend. The rest of the suite leaves about a third of a 2-core machine idle (user CPU
33 min in a 23-minute run, AMD EPYC (without AMX), 2 cores, 2026-12-08), so those commands
start with the session, one after another at the lowest CPU priority (``nice -n 19``): they
take the time the other tests leave and barely delay them. A test marked
``@pytest.mark.prestarted(command_of=...)`` takes its command's result from the ``prestarted``
fixture: at once when the run is over, after a wait while it runs, or by running it itself,
in the foreground, when the queue has not reached it yet. Every test still checks its own
run's output; only when the run happens moves.

``command_of`` is called once at the session's start with a new folder the command may
write in (under pytest's temporary folder of the session), and returns the
:class:`Command`, or ``None`` where the test cannot run here (its own skip marker says why).
"""

from __future__ import annotations

import shutil
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
NICE = shutil.which("nice")  # coreutils; without it the runs wait for their tests
BACKGROUND_TIMEOUT_SECONDS = 1800  # at the lowest priority a run may wait long for a core


@dataclass(frozen=True)
class Command:
    """A command a test runs in a process of its own, with its environment."""

    args: Sequence[str]
    env: Mapping[str, str] | None = None
    timeout: float = 600


@dataclass
class _Run:
    command: Command
    started: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    result: subprocess.CompletedProcess[str] | None = None
    error: BaseException | None = None


class PrestartedRuns:
    """Runs commands one after another in a background thread, at the lowest priority."""

    def __init__(self, commands: Mapping[str, Command]) -> None:
        self._runs = {key: _Run(command) for key, command in commands.items()}
        self._lock = threading.Lock()
        self._stopping = False
        self._background: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._work, name="prestarted", daemon=True)

    def start(self) -> None:
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
                niced = [NICE or "nice", "-n", "19", *run.command.args]
                timeout = max(run.command.timeout, BACKGROUND_TIMEOUT_SECONDS)
                self._finish(run, niced, timeout, background=True)

    def _finish(self, run: _Run, args: Sequence[str], timeout: float, *, background: bool) -> None:
        env = None if run.command.env is None else dict(run.command.env)
        try:
            with subprocess.Popen(
                list(args),
                env=env,
                cwd=REPO,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            ) as process:
                if background:
                    self._background = process
                    if self._stopping:  # stopped between the claim and the start
                        process.kill()
                try:
                    stdout, stderr = process.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.communicate()
                    raise
            run.result = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
        except BaseException as error:  # handed to the test, which reports it
            run.error = error
        finally:
            if background:
                self._background = None
            run.done.set()

    def command(self, key: str) -> Command:
        return self._runs[key].command

    def started(self, key: str) -> bool:
        return self._runs[key].started

    def result(self, key: str) -> subprocess.CompletedProcess[str]:
        """The finished run of ``key``'s command: waited for, or run here if not started."""
        run = self._runs[key]
        if self._claim(run, background=False):
            self._finish(run, run.command.args, run.command.timeout, background=False)
        run.done.wait()
        if run.error is not None:
            raise run.error
        assert run.result is not None
        return run.result

    def stop(self) -> None:
        """Starts nothing more and ends the run under way (the session is over)."""
        with self._lock:
            self._stopping = True
        process = self._background
        if process is not None and process.poll() is None:
            process.kill()


def commands_of(
    items: Sequence[pytest.Item], scratch_of: Callable[[str], Path]
) -> dict[str, Command]:
    """The commands of the marked tests among ``items``, in the session's order; each gets a
    new folder of its own to write in (``scratch_of(test name)``)."""
    commands: dict[str, Command] = {}
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is None:
            continue
        command_of: Callable[[Path], Command | None] = marker.kwargs["command_of"]
        command = command_of(scratch_of(item.name))
        if command is not None:
            commands[item.nodeid] = command
    return commands
