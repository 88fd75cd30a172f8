"""The exactness probe's answer, remembered per model, library, device and load settings.

The probe (:func:`backends.engines.interface.probe_exact_batch_limit`) runs a few dozen
forward passes at load, and where a row is dear that is most of the load: 2.1 s of the
Qwen2.5-Coder 1.5B's 3.2 s on a 2-core AMD EPYC (Zen 4), 14.5 s for SmolLM2 on lavapipe,
20 s for SmolLM2 on MLX's CPU backend (2026-12-07). Its answer depends only on what
computes the rows: the model's files, the library and its kernels, the device, the
environment variables the kernels read and the load settings. An engine writes all of
those into a *fingerprint*; a later load with the same fingerprint reads the answer back
instead of probing, and any change (an upgraded library, a rebuilt kernel, another CPU
variant, a new copy of the model, other settings) probes again.

Kept in ``<cache dir>/exactness.json`` (a file SpecDeck can make again; deleting it only
costs the next load its probe), at most :data:`MAX_REMEMBERED` answers. A file that cannot
be read or written is a warning in the log, never a failed load.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.paths import cache_dir, write_json_atomically

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

log = logging.getLogger(__name__)

EXACTNESS_FILE = "exactness.json"
# The answers kept, newest (remembered or recalled) last: a suite run of the tests loads about
# a hundred models under keys of their own (copies in temporary folders among them), and an
# entry is about 100 bytes.
MAX_REMEMBERED = 512
# Part of every fingerprint: bump it when the probe or an engine's evaluate path changes,
# so that answers of the old code are probed again.
PROBE_CODE_VERSION = 1
# Environment variables that can choose kernels or devices (ggml's own, SpecDeck's CPU
# variant and flags, its AMX switch, its GPU seams): a different value, a new fingerprint.
KERNEL_ENV_PREFIXES = ("GGML_", "SPECDECK_CPU_", "SPECDECK_ALLOW_", "SPECDECK_GPU_", "MLX_")


@dataclass(frozen=True)
class ProbedExactness:
    """What one probe found."""

    limit: int  # the largest batch whose rows equal single steps bitwise
    siblings: bool  # whether sibling branches were exact too (False where not probed)
    probed_on: str  # the day of the probe, ISO format

    @property
    def note(self) -> str:
        """The load report's line for an answer read back."""
        return (
            f"exact batches up to {self.limit} tokens, as probed on {self.probed_on} "
            "(same model, library, device and settings)"
        )


# How much of each end of a file folder_content_identity hashes.
CONTENT_SAMPLE_BYTES = 1 << 20


def file_identity(path: Path) -> list[Any]:
    """A file as a fingerprint sees it: where it is, its size and its modification time."""
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def folder_content_identity(folder: Path) -> list[list[Any]]:
    """A model folder as its content: each file's name, size and the hash of its ends.

    Not where the folder is or when it was written, so a model imported again from the same
    GGUF file, or copied, is the same model (the import writes the same bytes). The first
    and last MiB of each file carry its header and the start and end of its tensors (read
    in milliseconds, where hashing gigabytes of weights would cost more than a probe on a
    GPU). Notes for people (``*.md``) do not count.
    """
    identity = []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix == ".md":
            continue
        size = path.stat().st_size
        digest = hashlib.sha256()
        with path.open("rb") as file:
            digest.update(file.read(CONTENT_SAMPLE_BYTES))
            if size > 2 * CONTENT_SAMPLE_BYTES:
                file.seek(size - CONTENT_SAMPLE_BYTES)
                digest.update(file.read(CONTENT_SAMPLE_BYTES))
            elif size > CONTENT_SAMPLE_BYTES:
                digest.update(file.read())
        identity.append([path.name, size, digest.hexdigest()])
    return identity


def files_identity(paths: Iterable[Path]) -> list[list[Any]]:
    """:func:`file_identity` of each file, sorted (a folder's weights, a library's parts)."""
    return sorted(file_identity(path) for path in paths if path.is_file())


def kernel_environment() -> dict[str, str]:
    """The environment variables that can change which kernels compute a row."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(KERNEL_ENV_PREFIXES)}


def fingerprint_key(fingerprint: Mapping[str, Any]) -> str:
    """The fingerprint as a short stable key (its canonical JSON, hashed)."""
    canonical = json.dumps(
        {"probe_code": PROBE_CODE_VERSION, **fingerprint}, sort_keys=True, default=str
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


class ExactnessMemory:
    """The remembered probe answers, by fingerprint key (newest last)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_dir() / EXACTNESS_FILE

    def recall(self, key: str) -> ProbedExactness | None:
        """The answer probed under ``key`` (None: never probed, or the file is unreadable).

        An answer recalled from the older half moves to the newest end, so the answers in use
        outlive those of one-off loads (a model copied to a temporary folder).
        """
        entries = self._read()
        entry = entries.get(key)
        if not isinstance(entry, dict):
            return None
        try:
            recalled = ProbedExactness(
                int(entry["limit"]), bool(entry["siblings"]), str(entry["probed_on"])
            )
        except (KeyError, TypeError, ValueError):
            return None
        if list(entries).index(key) < len(entries) // 2:
            entries[key] = entries.pop(key)
            self._write(entries)
        return recalled

    def remember(self, key: str, limit: int, *, siblings: bool = False) -> ProbedExactness:
        """Keep what a probe under ``key`` found; returns it as recalled later."""
        probed = ProbedExactness(limit, siblings, datetime.date.today().isoformat())
        entries = self._read()
        entries.pop(key, None)
        entries[key] = {"limit": limit, "siblings": siblings, "probed_on": probed.probed_on}
        self._write(entries)
        return probed

    def _write(self, entries: dict[str, Any]) -> None:
        kept = dict(list(entries.items())[-MAX_REMEMBERED:])
        try:
            write_json_atomically(self.path, {"answers": kept})
        except OSError as error:
            log.warning("cannot remember the exactness probe in %s: %s", self.path, error)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            log.warning("ignoring unreadable %s: %s", self.path, error)
            return {}
        answers = data.get("answers") if isinstance(data, dict) else None
        return dict(answers) if isinstance(answers, dict) else {}
