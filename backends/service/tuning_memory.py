"""What "Find my fastest setup" measured, remembered per main model and machine.

A result holds for one main model file on one machine: the CPU (model and flags), the
accelerator the main model ran on, the engine build and the thread count. It is offered
again while all of those stay the same; when one changes the result is kept but marked
stale, with what changed ("threads 2 → 4"), so the window can ask for a new run. Stored as
JSON in the data folder (``tuning.json``), written atomically.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.engines.load_guard import cpu_identity, engine_build
from backends.paths import user_data_dir, write_json_atomically
from backends.service.tuning import TuningRow, winner

if TYPE_CHECKING:
    from backends.engines.interface import LoadReport
    from backends.service.protocol import EngineKind
    from backends.service.tuning import TuningOutcome

log = logging.getLogger(__name__)

TUNING_FILE = "tuning.json"
_FILE_VERSION = 1
_KEPT_PER_MAIN = 4  # older machines' results for one main model are dropped beyond this


@dataclass(frozen=True)
class TuningKey:
    """What a tuning result holds for: the main model file and the machine it ran on."""

    main_path: str
    main_size: int
    cpu: str
    accelerator: str  # where the main model ran: "CPU (sapphirerapids)", "CUDA", "MLX (Metal)"
    build: str
    threads: int

    def changes_from(self, earlier: TuningKey) -> list[str]:
        """What differs from ``earlier``'s machine, in words ("threads 2 → 4")."""
        names = {"cpu": "CPU", "accelerator": "device", "build": "build", "threads": "threads"}
        changed = []
        for name, words in names.items():
            before, now = getattr(earlier, name), getattr(self, name)
            if before != now:
                changed.append(f"{words} {before} → {now}")
        if (earlier.main_path, earlier.main_size) != (self.main_path, self.main_size):
            changed.append("the main model file")
        return changed


def machine_key(
    main_path: Path | str, report: LoadReport, engine: EngineKind = "llama.cpp"
) -> TuningKey:
    """The key of results measured on this machine on the main model at ``main_path``.

    ``report`` is its load report: the device it ran on (with workers, where each layer
    went: a result measured on this machine alone does not speak for them) and the threads.
    """
    path = Path(main_path)
    try:
        size = path.stat().st_size if path.is_file() else _folder_size(path)
    except OSError:
        size = -1
    return TuningKey(
        main_path=str(path.resolve()),
        main_size=size,
        cpu=cpu_identity(),
        accelerator=report.placement if report.layer_placement else report.backend,
        build=engine_build() if engine == "llama.cpp" else _mlx_build(),
        threads=report.n_threads,
    )


def _folder_size(folder: Path) -> int:
    return sum(item.stat().st_size for item in folder.iterdir() if item.is_file())


def _mlx_build() -> str:
    try:
        return f"mlx {importlib.metadata.version('mlx')}"
    except importlib.metadata.PackageNotFoundError:
        return "mlx (unknown version)"


@dataclass(frozen=True)
class RememberedTuning:
    """One finished tuning run."""

    key: TuningKey
    rows: tuple[TuningRow, ...]
    prompts: tuple[str, ...]
    trial_tokens: int
    seconds: float
    measured_at: float  # time.time()

    @classmethod
    def of(cls, key: TuningKey, outcome: TuningOutcome) -> RememberedTuning:
        """The record of ``outcome`` measured under ``key``."""
        return cls(
            key,
            tuple(outcome.rows),
            tuple(outcome.prompts),
            outcome.trial_tokens,
            outcome.seconds,
            time.time(),
        )

    @property
    def winner(self) -> TuningRow | None:
        """The fastest setup (plain unless another beats it)."""
        return winner(self.rows)

    def to_json(self) -> dict[str, Any]:
        """The record as the file and the engine process's events hold it."""
        return {
            "key": asdict(self.key),
            "rows": [asdict(row) for row in self.rows],
            "prompts": list(self.prompts),
            "trial_tokens": self.trial_tokens,
            "seconds": self.seconds,
            "measured_at": self.measured_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RememberedTuning:
        """Read what :meth:`to_json` wrote (KeyError/TypeError/ValueError when malformed)."""
        key_fields = {f.name for f in fields(TuningKey)}
        return cls(
            TuningKey(**{name: data["key"][name] for name in key_fields}),
            tuple(TuningRow.from_json(row) for row in data["rows"]),
            tuple(str(prompt) for prompt in data["prompts"]),
            int(data["trial_tokens"]),
            float(data["seconds"]),
            float(data["measured_at"]),
        )


@dataclass(frozen=True)
class Recall:
    """The last result for a main model, and what changed on the machine since (if anything)."""

    tuning: RememberedTuning
    changes: tuple[str, ...]

    @property
    def current(self) -> bool:
        """Whether it was measured under the same key (nothing changed)."""
        return not self.changes


class TuningMemory:
    """The remembered results, in ``tuning.json`` in the data folder (or ``path``)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or user_data_dir() / TUNING_FILE

    def all(self) -> list[RememberedTuning]:
        """Every record; a missing or unreadable file is an empty memory."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("version") != _FILE_VERSION:
                return []
            return [RememberedTuning.from_json(entry) for entry in data["results"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("ignoring unreadable %s: %s", self.path, error)
            return []

    def recall(self, key: TuningKey) -> Recall | None:
        """The newest result for ``key``'s main model: current if measured under ``key``."""
        same_main = [
            record
            for record in self.all()
            if (record.key.main_path, record.key.main_size) == (key.main_path, key.main_size)
        ]
        if not same_main:
            return None
        exact = [record for record in same_main if record.key == key]
        if exact:
            return Recall(max(exact, key=lambda r: r.measured_at), ())
        newest = max(same_main, key=lambda r: r.measured_at)
        return Recall(newest, tuple(key.changes_from(newest.key)))

    def remember(self, tuning: RememberedTuning) -> None:
        """Keep ``tuning``, replacing the result measured under the same key."""
        kept = [record for record in self.all() if record.key != tuning.key]
        same_main = sorted(
            (r for r in kept if r.key.main_path == tuning.key.main_path),
            key=lambda r: r.measured_at,
        )
        dropped = same_main[: max(0, len(same_main) - (_KEPT_PER_MAIN - 1))]
        kept = [record for record in kept if record not in dropped]
        kept.append(tuning)
        data = {"version": _FILE_VERSION, "results": [record.to_json() for record in kept]}
        write_json_atomically(self.path, data)
