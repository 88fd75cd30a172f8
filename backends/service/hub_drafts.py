"""Drafts to suggest for a main model, from its family on the Hugging Face hub.

Found with :mod:`backends.models.hub` (search, listings, a header read by range requests,
the draft verdict) and ranked with the speculation theory's ceiling
(:func:`backends.speculation.estimates.speedup_ceiling`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.engines.hardware import estimate_model_memory
from backends.errors import SpecDeckError
from backends.models.draft_verdict import draft_verdict
from backends.models.hub import (
    HubEngine,
    HubFile,
    fits_here,
    gguf_files,
    mlx_folders,
    remote_model_info,
    search,
)
from backends.speculation.estimates import BatchCosts, speedup_ceiling

if TYPE_CHECKING:
    from backends.models.gguf_info import ModelInfo

logger = logging.getLogger(__name__)

SUGGESTION_REPOS = 6  # candidate repos whose headers are read (a few MB each)
SEARCH_LIMIT = 40  # the family's repos looked at, most downloaded first
_INSTRUCT_PATTERN = re.compile(r"instruct|chat|(?<![a-z])it(?![a-z])", re.IGNORECASE)
_SIZE_PATTERN = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)\s*([BM])(?![A-Za-z])", re.IGNORECASE)
_NAME_NOISE = re.compile(r"\b(gguf|instruct|chat|it)\b", re.IGNORECASE)


def fits_at_context(
    info: ModelInfo, n_ctx: int, ram_free: int, gpu_free: tuple[int, str] | None
) -> str:
    """Whether a file whose header has been read fits here at ``n_ctx`` tokens of context.

    The model alone, as :func:`estimate_model_memory` counts it (weights and KV cache),
    against the free memory; the load check counts the pair with some headroom.
    """
    needed = estimate_model_memory(info, n_ctx)
    return fits_here(info.file_size, ram_free, gpu_free, needed=needed)


@dataclass(frozen=True)
class DraftSuggestion:
    """A hub file that can draft for a main model, and what it can gain at best."""

    file: HubFile
    info: ModelInfo
    best_speedup: float  # every drafted token accepted (Leviathan et al., α = 1)
    draft_step_share: float  # a draft step's cost in main steps: its size over the main's
    # The main model's verification batches as measured on this machine at its load, in
    # single steps by batch size (empty: not measured, taken as free).
    verify_steps: tuple[tuple[int, float], ...] = ()

    @property
    def explanation(self) -> str:
        """Where the figure comes from, in one line."""
        verification = (
            "verification as measured here at load (a batch of "
            f"{self.verify_steps[-1][0]} tokens costs {self.verify_steps[-1][1]:.2f} steps)"
            if self.verify_steps
            else "verification taken as free (load this main model with auto to use this "
            "machine's batch costs)"
        )
        return (
            f"≤ {self.best_speedup:.2f}× at best: a draft step costs about "
            f"{self.draft_step_share:.0%} of a main step (the files' sizes: decoding reads "
            f"every weight once a token), {verification}, every draft accepted; "
            "Find my fastest setup measures the real figure"
        )


def parameter_billions(text: str) -> float | None:
    """The size a name states ("0.5B" → 0.5, "135M" → 0.135), or None."""
    found = _SIZE_PATTERN.search(text)
    if found is None:
        return None
    value = float(found.group(1))
    return value / 1000 if found.group(2).upper() == "M" else value


def family_query(main: ModelInfo) -> str:
    """What to search the hub for to find ``main``'s family: its name before its size."""
    name = _NAME_NOISE.sub(" ", main.name)
    before_size = _SIZE_PATTERN.split(name, maxsplit=1)[0]
    words = before_size.split() or name.split()[:1]
    return "-".join(words)


def suggest_drafts(
    main: ModelInfo,
    *,
    main_costs: BatchCosts | None = None,
    token: str | None = None,
    repos: int = SUGGESTION_REPOS,
) -> list[DraftSuggestion]:
    """Drafts for ``main`` from its family on the hub, best expected speed-up first.

    The family's repos smaller than ``main`` (instruct ones for an instruct main) are
    searched; of each, the file of ``main``'s quantization (else Q4_K_M, else the smallest)
    is judged by its header alone, and only those that can draft are kept. The figure
    ranking them is the ceiling of :func:`backends.speculation.estimates.speedup_ceiling`
    with a draft step of the files' size ratio and the verification costs ``main_costs``
    measured on this machine (the main model's batch costs at its load; free without
    them): an upper bound that orders drafts by their cost, not a measurement of them.
    """
    single = main_costs.cost(1) if main_costs is not None else 0.0
    measured = main_costs if main_costs is not None and single > 0.0 else None

    def verify_steps(size: int) -> float:
        return measured.cost(size) / single if measured is not None else 1.0

    steps_seen = (
        tuple((size, verify_steps(size)) for size in sorted(measured.seconds) if size > 1)
        if measured is not None
        else ()
    )
    main_size = parameter_billions(main.size_label) or main.parameter_count / 1e9
    wants_instruct = bool(_INSTRUCT_PATTERN.search(main.name))
    engine: HubEngine = "mlx" if main.format == "mlx" else "llama.cpp"
    list_files = mlx_folders if engine == "mlx" else gguf_files
    candidates = []
    for repo in search(family_query(main), engine, limit=SEARCH_LIMIT, token=token):
        size = parameter_billions(repo.repo_id.split("/")[-1])
        if size is None or size >= main_size or repo.gated:
            continue
        if wants_instruct and not _INSTRUCT_PATTERN.search(repo.repo_id.split("/")[-1]):
            continue
        candidates.append(repo)
    suggestions = []
    for repo in candidates[:repos]:
        try:
            files = list_files(repo.repo_id, token=token)
            chosen = _preferred_file(files, main.quantization)
            if chosen is None:
                continue
            info = remote_model_info(chosen, token=token)
        except SpecDeckError as error:  # unreachable, gated, not a language model
            logger.info("suggestions: %s left out: %s", repo.repo_id, error)
            continue
        if not draft_verdict(main, info).can_draft:
            continue
        share = chosen.size / max(main.file_size, 1)
        best = speedup_ceiling(verify_steps, share)
        suggestions.append(DraftSuggestion(chosen, info, best, share, steps_seen))
    return sorted(suggestions, key=lambda suggestion: -suggestion.best_speedup)


def _preferred_file(files: list[HubFile], quantization: str) -> HubFile | None:
    """The main model's quantization, else Q4_K_M, else the smallest file."""
    for wanted in (quantization.upper(), "Q4_K_M"):
        for file in files:
            if file.quantization == wanted:
                return file
    return files[0] if files else None
