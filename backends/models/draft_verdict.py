"""Which local models can draft for a main model, and, for each that cannot, exactly why.

LM Studio answers "no compatible draft models" with no reason; this module gives one line
per candidate. The tokenizer rules are llama.cpp's (:mod:`backends.models.compat`: family,
vocabulary type and size, BOS/EOS, how many token texts differ and the first one); around
them come the rules that decide whether a draft is worth loading here: the model format
the main model's engine reads (with the GGUF to MLX import offered where it fixes it), a
vision model's projector, a draft bigger than the main model, and the free memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from backends.engines.hardware import estimate_model_memory, estimate_pair_memory
from backends.engines.interface import DEFAULT_CONTEXT_SIZE
from backends.models.compat import compatibility_problem

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from backends.models.gguf_info import ModelInfo

# "compatible": can draft. "import first": the same tokenizer, but a GGUF file for an MLX
# main model (the GGUF to MLX import makes it usable). The rest cannot draft here.
VerdictKind = Literal["compatible", "import first", "incompatible", "vision", "bigger", "no room"]
MMPROJ_PREFIX = "mmproj"
MLX_VISION_KEYS = ("vision_config", "vision_tower")
VERDICT_TITLES: dict[VerdictKind, str] = {
    "compatible": "can draft",
    "import first": "import first",
    "incompatible": "cannot draft",
    "vision": "cannot draft",
    "bigger": "will not pay",
    "no room": "does not fit",
}
# As loading refuses a pair: the estimate is an estimate and the OS can page others out.
NO_ROOM_FACTOR = 1.5


@dataclass(frozen=True)
class DraftVerdict:
    """Whether one model can draft for the main model, with the reason in one line."""

    draft: ModelInfo
    kind: VerdictKind
    reason: str  # why not, or what makes it a fit ("same tokenizer (151,936 tokens), 0.5B")

    @property
    def can_draft(self) -> bool:
        """Whether the pair loads and runs as it is."""
        return self.kind == "compatible"

    @property
    def title(self) -> str:
        """The verdict in two or three words: "can draft", "cannot draft", "will not pay"."""
        return VERDICT_TITLES[self.kind]

    @property
    def summary(self) -> str:
        """The verdict and its reason in one line: "cannot draft: another family (…)"."""
        return f"{self.title}: {self.reason}"


def draft_verdict(
    main: ModelInfo,
    draft: ModelInfo,
    *,
    free_memory: int | None = None,
    n_ctx: int = DEFAULT_CONTEXT_SIZE,
    main_loaded: bool = False,
) -> DraftVerdict:
    """The verdict on ``draft`` drafting for ``main``.

    ``free_memory`` (bytes available now) enables the memory rule; with ``main_loaded``
    the main model is already in memory, so only the draft has to fit in what is free.
    """
    problem = compatibility_problem(main, draft)
    if problem is not None:
        return DraftVerdict(draft, "incompatible", problem.removeprefix("incompatible pair: "))
    if draft.format != main.format:
        if main.format == "mlx":
            return DraftVerdict(
                draft,
                "import first",
                f"a GGUF file and the main model is an MLX folder: import it to MLX "
                f"(same tokenizer, {draft.vocab.size:,} tokens)",
            )
        return DraftVerdict(
            draft,
            "incompatible",
            "an MLX folder and the main model is a GGUF file (llama.cpp reads GGUF only): "
            "pick the same model's GGUF",
        )
    projector = vision_projector(draft)
    if projector is not None and draft.path != main.path:
        return DraftVerdict(
            draft,
            "vision",
            f"a vision model (its projector {projector} lies beside it): drafts are "
            "text-only models; pick the text-only version",
        )
    if draft.parameter_count > main.parameter_count and draft.path != main.path:
        return DraftVerdict(
            draft,
            "bigger",
            f"bigger than the main model ({draft.size_label} vs {main.size_label}): each draft "
            "step would cost more than the main model step it saves",
        )
    if free_memory is not None:
        needed = (
            estimate_model_memory(draft, n_ctx)
            if main_loaded
            else estimate_pair_memory(main, draft, n_ctx)
        )
        if needed > free_memory * NO_ROOM_FACTOR:
            what = "the draft needs" if main_loaded else "the pair needs"
            return DraftVerdict(
                draft,
                "no room",
                f"does not fit: {what} about {needed / 2**30:.1f} GB and "
                f"{free_memory / 2**30:.1f} GB is free",
            )
    if draft.path == main.path:
        return DraftVerdict(draft, "compatible", "the main model itself (self-speculation)")
    return DraftVerdict(
        draft,
        "compatible",
        f"same tokenizer ({draft.vocab.size:,} tokens), {draft.size_label} for a "
        f"{main.size_label} main model",
    )


def draft_verdicts(
    main: ModelInfo,
    candidates: Iterable[ModelInfo],
    *,
    free_memory: int | None = None,
    n_ctx: int = DEFAULT_CONTEXT_SIZE,
    main_loaded: bool = False,
) -> list[DraftVerdict]:
    """Every candidate's verdict: those that can draft first (smallest first), then the rest."""
    verdicts = [
        draft_verdict(main, info, free_memory=free_memory, n_ctx=n_ctx, main_loaded=main_loaded)
        for info in candidates
    ]
    return sorted(verdicts, key=lambda v: (not v.can_draft, v.draft.parameter_count))


def vision_projector(info: ModelInfo) -> str | None:
    """The name of the vision part a model comes with, or None for a text-only model.

    A GGUF vision model ships a projector file (``mmproj-*.gguf``) in its own folder, as LM
    Studio and the Hugging Face cache keep them; a folder holding several models is not
    judged by one projector. An MLX vision model names a vision tower in its config.
    """
    if info.format == "mlx":
        try:
            config = json.loads((info.path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        found = [key for key in MLX_VISION_KEYS if isinstance(config, dict) and key in config]
        return f"config.json's {found[0]}" if found else None
    folder: Path = info.path.parent
    try:
        ggufs = [path.name for path in folder.iterdir() if path.name.lower().endswith(".gguf")]
    except OSError:
        return None
    projectors = sorted(name for name in ggufs if name.lower().startswith(MMPROJ_PREFIX))
    models = [name for name in ggufs if not name.lower().startswith(MMPROJ_PREFIX)]
    if projectors and len(models) == 1:
        return projectors[0]
    return None
