"""The speculation methods a user picks, and the decoder each one builds.

- ``auto`` (the default): the planner chooses every round between the draft model (when
  one is loaded), the lookups (n-gram and edit copy) and plain decoding, from measured
  costs and acceptance, so speculation is used where it pays and not where it costs.
- ``draft-model``, ``ngram-simple``, ``ngram-mod``, ``edit-copy``: one method forced. With
  a fixed draft length every round drafts up to the maximum (llama.cpp's behaviour); with an
  adaptive one the planner still picks the length, 0 (plain decoding) included.
- ``off``: plain decoding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from backends.errors import SettingsError
from backends.speculation.drafters import DraftModelDrafter
from backends.speculation.edit_copy import EditCopyDrafter
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.ngram import NgramModDrafter, NgramSimpleDrafter
from backends.speculation.types import DEFAULT_P_MIN

if TYPE_CHECKING:
    from backends.engines.interface import ModelEngine
    from backends.speculation.planner import CostCache
    from backends.speculation.types import Drafter

SpeculationMethod = Literal["auto", "draft-model", "ngram-simple", "ngram-mod", "edit-copy", "off"]
METHODS: tuple[SpeculationMethod, ...] = get_args(SpeculationMethod)
DEFAULT_METHOD: SpeculationMethod = "auto"


def parse_method(text: str) -> SpeculationMethod:
    """Validate a method name from the command line or settings."""
    for method in METHODS:
        if text == method:
            return method
    raise SettingsError(f"unknown speculation method {text!r}; choose one of {', '.join(METHODS)}")


def build_decoder(
    method: SpeculationMethod,
    target: ModelEngine,
    draft: ModelEngine | None = None,
    *,
    adaptive: bool = True,
    p_min: float = DEFAULT_P_MIN,
    cost_cache: CostCache | None = None,
) -> SpeculativeDecoder:
    """A decoder for ``method`` on ``target`` (``draft`` is the loaded draft model, if any).

    Decoders given the same ``cost_cache`` calibrate each engine once between them.
    """
    drafters: list[Drafter] = []
    if method == "auto":
        drafters = [EditCopyDrafter(), NgramModDrafter()]
        if draft is not None:
            drafters.append(DraftModelDrafter(draft, p_min=p_min))
        return SpeculativeDecoder(target, drafters, adaptive=True, cost_cache=cost_cache)
    if method == "draft-model":
        if draft is None:
            raise SettingsError("the draft-model method needs a draft model; load one first")
        drafters = [DraftModelDrafter(draft, p_min=p_min)]
    elif method == "ngram-simple":
        drafters = [NgramSimpleDrafter()]
    elif method == "ngram-mod":
        drafters = [NgramModDrafter()]
    elif method == "edit-copy":
        drafters = [EditCopyDrafter()]
    elif method != "off":
        raise SettingsError(f"unknown speculation method {method!r}")
    return SpeculativeDecoder(target, drafters, adaptive=adaptive, cost_cache=cost_cache)
