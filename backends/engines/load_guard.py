"""A native crash while loading is survived once and never repeated.

Native code (llama.cpp's CPU kernels, a GPU driver) can kill the process that loads a model
— llama.cpp's AMX kernels did on Sapphire Rapids Xeons — and no Python ``except`` sees it.
So loads run in a process that may die (the window's engine process, specdeck-bench's
worker), and the process that watches it uses what is here:

- :func:`checkpoint` marks each risky step of a load (``LOAD_STAGES``); listeners learn
  the stage before the step runs, so after a crash the watcher knows where it died. It is
  also the fault-injection point: ``$SPECDECK_CRASH_AT=STAGE`` makes the process die with
  a real SIGSEGV there (``STAGE:unless-safe`` spares loads with the safest settings), so
  every crash path is tested on every CPU.
- :class:`CrashRecords` remembers which load settings crashed for which model file on
  which CPU and llama.cpp build (``load-crashes.json`` in the data dir) and picks the
  settings for the next load: the requested ones, the safest ones when those crashed, or
  a refusal when even the safest crashed.
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from backends.engines.weight_placement import cpu_flags, cpu_model_name
from backends.errors import SpecDeckError
from backends.paths import user_data_dir, write_json_atomically

if TYPE_CHECKING:
    from backends.engines.weight_placement import WeightRepacking

log = logging.getLogger(__name__)

LoadStage = Literal["main-model", "main-probe", "draft-model", "calibration", "loaded"]
LOAD_STAGES: tuple[LoadStage, ...] = (
    "main-model",
    "main-probe",
    "draft-model",
    "calibration",
    "loaded",
)
STAGE_DESCRIPTIONS: dict[str, str] = {
    "main-model": "loading the main model",
    "main-probe": "running the main model's first forward pass",
    "draft-model": "loading the draft model",
    "calibration": "measuring batch costs",
    "loaded": "finishing the load",
}
CRASH_AT_ENV = "SPECDECK_CRASH_AT"
UNLESS_SAFE = "unless-safe"
CRASH_RECORDS_FILE = "load-crashes.json"
_RECORDS_VERSION = 1


class LoadRefusedError(SpecDeckError):
    """A load that crashed the engine before, even with the safest settings."""


@dataclass(frozen=True)
class RiskySettings:
    """The load settings a native crash can depend on."""

    weight_repacking: WeightRepacking = "auto"
    gpu_layers: int = -1  # main model layers on the GPU, -1 = all
    n_threads: int | None = None  # None = physical cores

    def describe(self) -> str:
        """E.g. "weight repacking auto, GPU layers all, default threads"."""
        if self == SAFEST:
            return SAFEST_DESCRIPTION
        gpu = "all" if self.gpu_layers < 0 else str(self.gpu_layers)
        threads = "default threads" if self.n_threads is None else f"{self.n_threads} threads"
        return f"weight repacking {self.weight_repacking}, GPU layers {gpu}, {threads}"


SAFEST = RiskySettings(weight_repacking="off", gpu_layers=0, n_threads=None)
SAFEST_DESCRIPTION = "no weight repacking, no GPU offload of the main model, default threads"


# -- checkpoints and fault injection ----------------------------------------------------------

StageListener = Callable[[str, str], None]  # (stage, model path)
_listeners: list[StageListener] = []


def add_stage_listener(listener: StageListener) -> None:
    """Call ``listener(stage, model)`` at every checkpoint of this process."""
    _listeners.append(listener)


def remove_stage_listener(listener: StageListener) -> None:
    """Stop calling ``listener``."""
    if listener in _listeners:
        _listeners.remove(listener)


def checkpoint(stage: LoadStage, model: Path | str = "", *, safe: bool = False) -> None:
    """A load reaches ``stage`` (for ``model``); tell the listeners, then crash if told to.

    ``safe``: the load uses the safest settings (``$SPECDECK_CRASH_AT=STAGE:unless-safe``
    spares it, so tests can watch a safe retry succeed).
    """
    for listener in list(_listeners):
        listener(stage, str(model))
    wanted = os.environ.get(CRASH_AT_ENV, "")
    if not wanted:
        return
    at, _, condition = wanted.partition(":")
    if at == stage and not (condition == UNLESS_SAFE and safe):
        log.warning("fault injection: crashing at %s (%s=%s)", stage, CRASH_AT_ENV, wanted)
        crash_natively()


def crash_natively() -> None:
    """Die as native code does: a read of address 0, SIGSEGV (an access violation on Windows)."""
    ctypes.string_at(0)


def signal_name(number: int) -> str:
    """The name of a signal that ended a process: "SIGSEGV" for 11."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# -- what crashed before ----------------------------------------------------------------------


def cpu_identity() -> str:
    """The CPU as crash records key it: its name and a digest of its flags."""
    flags = " ".join(sorted(cpu_flags()))
    return f"{cpu_model_name()} [{hashlib.sha256(flags.encode()).hexdigest()[:12]}]"


@functools.cache
def engine_build() -> str:
    """The llama.cpp build as crash records key it (a new build may have fixed a crash)."""
    try:
        return f"llama-cpp-python {importlib.metadata.version('llama-cpp-python')}"
    except importlib.metadata.PackageNotFoundError:
        return "llama-cpp-python (unknown version)"


def _model_identity(model: Path | str) -> str:
    path = Path(model)
    try:
        size = path.stat().st_size
    except OSError:
        size = -1
    return f"{path.resolve()}|{size}"


@dataclass(frozen=True)
class LoadCrash:
    """One load that killed the engine."""

    model: str  # path|size of the model file being loaded
    cpu: str
    build: str
    settings: RiskySettings
    stage: str
    detail: str
    when: str  # ISO date and time

    @property
    def model_name(self) -> str:
        """The file's name."""
        return Path(self.model.rpartition("|")[0]).name


def crash_message(model: Path | str, stage: str, settings: RiskySettings, detail: str) -> str:
    """One line: what crashed, where, with which settings."""
    where = STAGE_DESCRIPTIONS.get(stage, stage or "loading")
    text = f"the engine crashed while {where} ({Path(model).name}; {settings.describe()})"
    return f"{text}: {detail}" if detail else text


@dataclass(frozen=True)
class CrashVerdict:
    """What a watcher does after the process it watched died while loading.

    ``line`` says what crashed (capitalised by the caller where it starts a sentence);
    ``retry``: load once more, when the records now steer the same request to the safest
    settings; ``announcement``: the one line a watcher shows either way.
    """

    line: str
    retry: bool

    @property
    def announcement(self) -> str:
        """The crash and what happens next, in one line."""
        if self.retry:
            return f"{self.line}; retrying once with the safest settings ({SAFEST_DESCRIPTION})"
        return f"{self.line}; nothing safer is left to try"


def after_load_crash(
    records: CrashRecords,
    model: Path | str,
    settings: RiskySettings,
    stage: str,
    cause: str,
    *,
    retried: bool,
) -> CrashVerdict:
    """Record a crash while loading ``model``; retry once unless the safest settings crashed.

    ``retried``: this load was already the retry (a second crash ends the attempts). The
    window's load controller and specdeck-bench's worker watcher both decide here.
    """
    records.record(model, settings, stage, cause)
    line = crash_message(model, stage, settings, cause)
    return CrashVerdict(line, retry=settings != SAFEST and not retried)


class CrashRecords:
    """The load crashes seen on this machine, kept in ``load-crashes.json``."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or user_data_dir() / CRASH_RECORDS_FILE

    def all(self) -> list[LoadCrash]:
        """Every record (an unreadable file counts as none, and is replaced on the next one)."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            crashes = raw["crashes"] if raw.get("version") == _RECORDS_VERSION else []
            return [
                LoadCrash(**{**entry, "settings": RiskySettings(**entry["settings"])})
                for entry in crashes
            ]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("ignoring unreadable %s: %s", self.path, error)
            return []

    def record(
        self, model: Path | str, settings: RiskySettings, stage: str, detail: str
    ) -> LoadCrash:
        """Remember that loading ``model`` with ``settings`` crashed at ``stage``."""
        crash = LoadCrash(
            model=_model_identity(model),
            cpu=cpu_identity(),
            build=engine_build(),
            settings=settings,
            stage=stage,
            detail=" ".join(detail.split())[:300],
            when=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        )
        crashes = self.all()
        earlier = _first_match(crashes, crash.model, settings)
        self._write([*(c for c in crashes if c is not earlier), crash])
        log.warning("load crash recorded: %s with %s", crash.model_name, settings.describe())
        return crash

    def find(self, model: Path | str, settings: RiskySettings) -> LoadCrash | None:
        """The crash of loading ``model`` with ``settings`` here, if there was one."""
        return _first_match(self.all(), _model_identity(model), settings)

    def choose(
        self, models: Sequence[Path | str], requested: RiskySettings
    ) -> tuple[RiskySettings, LoadCrash | None]:
        """The settings to load ``models`` with, and the crash that made them differ.

        Raises LoadRefusedError when even the safest settings crashed for one of them.
        """
        crashes = self.all()
        identities = [_model_identity(model) for model in models]
        for identity in identities:
            crash = _first_match(crashes, identity, SAFEST)
            if crash is not None:
                where = STAGE_DESCRIPTIONS.get(crash.stage, crash.stage)
                raise LoadRefusedError(
                    f"{crash.model_name} crashed the engine on this CPU even with the safest "
                    f"settings ({SAFEST_DESCRIPTION}) while {where} on {crash.when[:10]}; "
                    "SpecDeck will not load it again by itself (Help > Forget load crashes "
                    "lets it try)"
                )
        for identity in identities:
            crash = _first_match(crashes, identity, requested)
            if crash is not None:
                return SAFEST, crash
        return requested, None

    def forget(self) -> int:
        """Drop every record; how many there were."""
        count = len(self.all())
        self.path.unlink(missing_ok=True)
        return count

    def _write(self, crashes: list[LoadCrash]) -> None:
        data = {"version": _RECORDS_VERSION, "crashes": [asdict(c) for c in crashes]}
        write_json_atomically(self.path, data)


def _first_match(
    crashes: Sequence[LoadCrash], identity: str, settings: RiskySettings
) -> LoadCrash | None:
    """The crash of that model file with those settings on this CPU and build, if any."""
    wanted = (identity, settings, cpu_identity(), engine_build())
    return next((c for c in crashes if (c.model, c.settings, c.cpu, c.build) == wanted), None)


def avoided_crash_note(crash: LoadCrash) -> str:
    """One line for the load report when the safest settings replaced the requested ones."""
    where = STAGE_DESCRIPTIONS.get(crash.stage, crash.stage)
    return (
        f"safest settings: {crash.model_name} crashed the engine on {crash.when[:10]} "
        f"with {crash.settings.describe()} (while {where})"
    )


__all__ = [
    "CRASH_AT_ENV",
    "CRASH_RECORDS_FILE",
    "LOAD_STAGES",
    "SAFEST",
    "SAFEST_DESCRIPTION",
    "STAGE_DESCRIPTIONS",
    "UNLESS_SAFE",
    "CrashRecords",
    "LoadCrash",
    "LoadRefusedError",
    "LoadStage",
    "RiskySettings",
    "add_stage_listener",
    "avoided_crash_note",
    "checkpoint",
    "crash_message",
    "crash_natively",
    "remove_stage_listener",
    "signal_name",
]
