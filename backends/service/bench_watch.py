"""specdeck-bench's worker watcher: a native crash while loading costs one line and a retry.

The measuring runs in a worker process (``python -m backends.service.bench`` again, with
``$SPECDECK_BENCH_WORKER`` naming a file where it writes its load settings and then every
load stage as it begins, :func:`report_stages`). When the worker dies while loading, the
crash is recorded for that model and CPU and the decision is
:func:`backends.engines.load_guard.after_load_crash`'s: one line says what happened, and
the worker runs once more, when the crash records steer it to the safest settings; a
second crash, or one with the safest settings, ends the command with exit code 3. A crash
after loading (the stage ``loaded``) is no load crash: one line, exit code 3, nothing
recorded; nor is the loss of an ``--rpc`` worker, which llama.cpp answers by aborting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from backends.engines.load_guard import (
    CrashRecords,
    RiskySettings,
    add_stage_listener,
    after_load_crash,
    signal_name,
)
from backends.engines.worker_probe import parse_workers, probe_worker
from backends.errors import SettingsError

if TYPE_CHECKING:
    from collections.abc import Sequence

PROG = "specdeck-bench"
WORKER_ENV = "SPECDECK_BENCH_WORKER"  # in the worker: the file its load stages go to
WORKER_MODULE = "backends.service.bench"
EXIT_ENGINE_CRASHED = 3
EXIT_INTERRUPTED = 130
ATTEMPTS = 2  # the first load, and one retry with the safest settings


def watch_workers(arguments: Sequence[str], rpc: str) -> int:
    """Run the bench in a worker; after a crash while loading, once more (safest settings).

    ``arguments``: the command line, passed on as it is; ``rpc``: its ``--rpc`` workers.
    """
    with tempfile.TemporaryDirectory(prefix="specdeck-bench-") as folder:
        stage_file = Path(folder) / "stages.jsonl"
        for attempt in range(1, ATTEMPTS + 1):
            stage_file.write_text("", encoding="utf-8")
            worker = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, *arguments],
                env={**os.environ, WORKER_ENV: str(stage_file)},
            )
            try:
                status = worker.wait()
            except KeyboardInterrupt:
                worker.wait()  # it got the interrupt too, and says so itself
                return EXIT_INTERRUPTED
            if status >= 0:
                return status
            cause = signal_name(-status)
            lost = lost_workers(rpc)
            if lost:
                print(
                    f"{PROG}: error: the engine stopped ({cause}): {'; '.join(lost)}",
                    file=sys.stderr,
                )
                return EXIT_ENGINE_CRASHED
            settings, stage, model = worker_progress(stage_file)
            if stage in ("", "loaded") or settings is None:
                print(f"{PROG}: error: the engine crashed ({cause}) after loading", file=sys.stderr)
                return EXIT_ENGINE_CRASHED
            verdict = after_load_crash(
                CrashRecords(), model, settings, stage, cause, retried=attempt == ATTEMPTS
            )
            if not verdict.retry:
                print(f"{PROG}: error: {verdict.announcement}", file=sys.stderr)
                return EXIT_ENGINE_CRASHED
            print(f"{PROG}: {verdict.announcement}", file=sys.stderr, flush=True)
    return EXIT_ENGINE_CRASHED


def lost_workers(rpc: str) -> list[str]:
    """After the bench process died: the ``--rpc`` workers that no longer answer, one line each.

    llama.cpp aborts when a worker goes away; that is no load crash to remember.
    """
    try:
        workers = parse_workers(rpc)
    except SettingsError:
        return []
    statuses = [probe_worker(worker) for worker in workers]
    return [
        f"worker {s.address} stopped answering ({s.problem})" for s in statuses if not s.reachable
    ]


def worker_progress(stage_file: Path) -> tuple[RiskySettings | None, str, str]:
    """What a dead worker wrote: the settings it loaded with, its last stage and model."""
    settings: RiskySettings | None = None
    stage = model = ""
    for line in stage_file.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if "settings" in entry:
            settings = RiskySettings(**entry["settings"])
        else:
            stage, model = entry["stage"], entry["model"]
    return settings, stage, model


def report_stages(stage_file: Path, settings: RiskySettings) -> None:
    """In the worker: write the load settings, then every load stage, for the watcher."""

    def write(entry: dict[str, object]) -> None:
        with stage_file.open("a", encoding="utf-8") as stream:
            stream.write(json.dumps(entry) + "\n")

    write({"settings": asdict(settings)})
    add_stage_listener(lambda stage, model: write({"stage": stage, "model": model}))
