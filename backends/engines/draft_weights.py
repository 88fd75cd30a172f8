"""A draft model's weights requantized to Q4_0 for speed on the CPU, made once and kept.

On a CPU a forward pass costs about what its weights take to read, so a draft's speed is
its file size. Small models are stored heavier than their name says: the Qwen2.5 0.5B's
rows of 896 values cannot hold K-quants (256-value blocks), so its "Q4_K_M" file falls
back to Q5_0/Q8_0 and keeps the 151,936-row embedding (also its output layer) in Q8_0:
over 6 bits per weight in all. Requantized to Q4_0 throughout (4.5 bits, a format llama.cpp
repacks for its fastest CPU kernels) its pass costs 29 ms instead of 39 ms on a 2-core
Xeon, and it still agrees with the 1.5B on 91-95 % of its drafts (docs/benchmarks.md, "Its
Q4_0 copy and the catch-up fix"). Only the draft
is ever requantized: the main model decides every token, so the output stays exactly the
main model's.

:func:`drafting_file` gives the file to load: the stored one, or the Q4_0 copy, made with
llama.cpp's own ``llama_model_quantize`` (:func:`backends.engines.llama_native.requantize_q4_0`)
on first use into ``<cache dir>/fast-drafts``
(keyed by the source's name, size and modification time; a stale copy of the same model
is removed) and reused afterwards.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Literal

from backends.errors import SettingsError
from backends.paths import cache_dir

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from backends.models.gguf_info import ModelInfo

log = logging.getLogger(__name__)

DraftWeights = Literal["auto", "stored", "q4_0"]
DRAFT_WEIGHT_MODES: tuple[DraftWeights, ...] = ("auto", "stored", "q4_0")
FAST_DRAFTS_FOLDER = "fast-drafts"
# Q4_0 stores 32 weights in 18 bytes. A stored file at most this much heavier per weight
# would not get faster (Q4_K_S, IQ4_XS, or already Q4_0), and lower-bit files would grow.
Q4_0_BITS_PER_WEIGHT = 4.5
WORTH_REQUANTIZING = 1.1
_COPY_VERSION = 1  # bump when the recipe changes, so that old copies are made anew


def check_draft_weights(mode: str) -> DraftWeights:
    """The mode if it is one of :data:`DRAFT_WEIGHT_MODES`, else a one-line SettingsError."""
    for known in DRAFT_WEIGHT_MODES:
        if mode == known:
            return known
    raise SettingsError(
        f"draft weights must be one of {', '.join(DRAFT_WEIGHT_MODES)}, got {mode!r}"
    )


def bits_per_weight(info: ModelInfo) -> float:
    """The stored file's bits per weight (metadata included, a little high)."""
    return 8.0 * info.file_size / max(1, info.parameter_count)


def wants_q4_0(mode: DraftWeights, info: ModelInfo, *, on_gpu: bool) -> bool:
    """Whether to draft with a Q4_0 copy: asked for, or ``auto`` on a CPU where it is lighter.

    ``auto`` leaves a draft on a GPU as it is (its kernels for the stored formats are fast
    and the gain is unmeasured there).
    """
    if mode == "stored":
        return False
    lighter = bits_per_weight(info) > Q4_0_BITS_PER_WEIGHT * WORTH_REQUANTIZING
    if mode == "q4_0":
        return info.quantization != "Q4_0"
    return lighter and not on_gpu


def fast_copy_path(source: Path, folder: Path | None = None) -> Path:
    """Where the Q4_0 copy of ``source`` is kept (whether or not it exists yet)."""
    stat = source.stat()
    key = f"{stat.st_size}-{stat.st_mtime_ns}-v{_COPY_VERSION}"
    return (folder or cache_dir() / FAST_DRAFTS_FOLDER) / f"{source.stem}.{key}.q4_0.gguf"


def drafting_file(
    info: ModelInfo,
    mode: DraftWeights,
    *,
    on_gpu: bool,
    requantize: Callable[[Path, Path], None],
    folder: Path | None = None,
) -> tuple[Path, str | None]:
    """The file to load as the draft, and a note for the load report (None: as stored).

    ``requantize(source, target)`` writes the Q4_0 copy when there is none yet (the engine
    that loads the draft brings it: ``backends.engines.llama_native.requantize_q4_0``).
    """
    if not wants_q4_0(mode, info, on_gpu=on_gpu):
        return info.path, None
    target = fast_copy_path(info.path, folder)
    before = bits_per_weight(info)
    if target.is_file():
        return target, f"draft requantized to Q4_0 for speed (from {before:.1f} bits per weight)"
    started = time.perf_counter()
    requantize(info.path, target)
    # Only this model's copies: "<stem>.<size>-<mtime>-v<n>.q4_0.gguf", not another model
    # whose name starts with this one's stem.
    for stale in target.parent.glob(f"{info.path.stem}.[0-9]*-[0-9]*-v*.q4_0.gguf"):
        if stale != target:
            stale.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    log.info("requantized %s to Q4_0 in %.1f s: %s", info.path.name, seconds, target)
    return target, (
        f"draft requantized to Q4_0 for speed (from {before:.1f} bits per weight; "
        f"made once in {seconds:.1f} s)"
    )
