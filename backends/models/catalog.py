"""Find GGUF models and MLX model folders in SpecDeck's, LM Studio's and HF's folders."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from backends.errors import ModelFileError
from backends.models.compat import compatibility_problem
from backends.models.gguf_info import (
    SPLIT_SHARD_NAME,
    ModelInfo,
    NotALanguageModelError,
    read_model_info,
)
from backends.models.mlx_info import MLX_CONFIG_FILE, SAFETENSORS_SUFFIX, read_mlx_model_info
from backends.paths import models_dir

if TYPE_CHECKING:
    from collections.abc import Iterable

logger = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
LMSTUDIO_MODEL_FOLDERS = (Path("~/.lmstudio/models"), Path("~/.cache/lm-studio/models"))


class ScanProblem(NamedTuple):
    """A file (or folder) the scan could not use, with the one-line reason."""

    path: Path
    message: str


@dataclass(frozen=True)
class CatalogScan:
    """The result of a scan: usable models, files that failed, and GGUF files that are not models.

    ``problems`` are worth showing the user (a truncated download, a corrupt file);
    ``ignored`` are valid GGUF files that are not language models (LoRA adapters, vision
    projectors), listed so that a UI can explain why they are missing, not as errors.
    """

    models: tuple[ModelInfo, ...]
    problems: tuple[ScanProblem, ...]
    ignored: tuple[ScanProblem, ...] = ()


def default_model_folders() -> list[Path]:
    """The model folders that exist here: SpecDeck's own, LM Studio's, the Hugging Face cache."""
    candidates = [models_dir(), *(folder.expanduser() for folder in LMSTUDIO_MODEL_FOLDERS)]
    candidates.append(huggingface_hub_cache())
    folders: list[Path] = []
    seen: set[Path] = set()
    for folder in candidates:
        if not folder.is_dir():
            continue
        resolved = folder.resolve()
        if resolved not in seen:
            seen.add(resolved)
            folders.append(folder)
    return folders


def huggingface_hub_cache() -> Path:
    """The hub cache folder as huggingface_hub computes it (the folder may not exist)."""
    if hub_cache := os.environ.get("HF_HUB_CACHE"):
        return Path(hub_cache).expanduser()
    if hf_home := os.environ.get("HF_HOME"):
        return Path(hf_home).expanduser() / "hub"
    cache_home = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(cache_home).expanduser() / "huggingface" / "hub"


def scan_models(folders: Iterable[Path] | None = None) -> CatalogScan:
    """Read every *.gguf model and MLX model folder under folders, recursively.

    ``folders`` defaults to default_model_folders(). An MLX model folder is one holding a
    config.json and *.safetensors weights (the mlx-community layout). Follows symbolic links
    (the Hugging Face cache's snapshot files are links into its blobs),
    lists each resolved file once, skips the second and later shards of split models, and
    collects unreadable files as problems instead of failing.
    """
    models: list[ModelInfo] = []
    problems: list[ScanProblem] = []
    ignored: list[ScanProblem] = []
    seen_files: set[str] = set()
    for folder in default_model_folders() if folders is None else folders:
        folder = Path(folder)
        if not folder.is_dir():
            problems.append(ScanProblem(folder, f"model folder not found: '{folder}'"))
            continue
        gguf_files, mlx_folders = _model_files(folder, problems)
        for path in gguf_files + mlx_folders:
            if _is_later_shard(path):
                continue
            resolved = os.path.realpath(path)
            if resolved in seen_files:
                continue
            seen_files.add(resolved)
            try:
                models.append(read_catalog_model(path))
            except NotALanguageModelError as error:
                ignored.append(ScanProblem(path, str(error)))
            except ModelFileError as error:
                logger.info("skipping %s: %s", path, error)
                problems.append(ScanProblem(path, str(error)))
    models.sort(key=lambda info: (info.name.casefold(), str(info.path)))
    problems.sort(key=lambda problem: str(problem.path))
    ignored.sort(key=lambda problem: str(problem.path))
    return CatalogScan(models=tuple(models), problems=tuple(problems), ignored=tuple(ignored))


def compatible_drafts(
    main: ModelInfo, candidates: Iterable[ModelInfo]
) -> list[tuple[ModelInfo, str | None]]:
    """Each candidate with the reason it cannot draft for main, or None when it can.

    The main file itself stays in the list: self-speculation (the same model drafting for
    itself) is allowed by llama.cpp and a useful baseline.
    """
    return [(candidate, compatibility_problem(main, candidate)) for candidate in candidates]


def _model_files(folder: Path, problems: list[ScanProblem]) -> tuple[list[Path], list[Path]]:
    """(every *.gguf file, every MLX model folder) under folder, sorted, following links once."""

    def report(error: OSError) -> None:
        where = Path(error.filename) if error.filename else folder
        problems.append(ScanProblem(where, f"cannot read folder '{where}': {error.strerror}"))

    found: list[Path] = []
    mlx_folders: list[Path] = []
    visited_folders: set[tuple[int, int]] = set()
    for root, dirnames, filenames in os.walk(folder, onerror=report, followlinks=True):
        try:
            root_stat = os.stat(root)
        except OSError:
            dirnames.clear()
            continue
        # A link back up the tree would make os.walk(followlinks=True) loop forever.
        identity = (root_stat.st_dev, root_stat.st_ino)
        if identity in visited_folders:
            dirnames.clear()
            continue
        visited_folders.add(identity)
        # Hidden folders hold caches' bookkeeping (.locks, .no_exist), never models.
        dirnames[:] = sorted(name for name in dirnames if not name.startswith("."))
        found.extend(
            Path(root, name)
            for name in sorted(filenames)
            if name.lower().endswith(GGUF_SUFFIX) and not name.startswith(".")
        )
        if MLX_CONFIG_FILE in filenames and any(
            name.endswith(SAFETENSORS_SUFFIX) for name in filenames
        ):
            mlx_folders.append(Path(root))
    return found, mlx_folders


def _is_later_shard(path: Path) -> bool:
    match = SPLIT_SHARD_NAME.match(path.name)
    return match is not None and int(match["number"]) > 1


def read_catalog_model(path: str | Path) -> ModelInfo:
    """A GGUF file's or an MLX model folder's ModelInfo (ModelFileError, one line, if unusable)."""
    model_path = Path(path)
    if model_path.is_dir():
        return read_mlx_model_info(model_path)
    return read_model_info(model_path)
