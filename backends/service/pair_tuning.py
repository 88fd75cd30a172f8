"""The tuner's trials on a loaded pair: every setup measured on its main model, remembered.

What :meth:`LoadedPair.tune <backends.service.loaded_pair.LoadedPair.tune>` runs.
"Find my fastest setup" in the window (the engine process's ``tune``) and
``specdeck-bench --tune`` both run here: :class:`~backends.service.tuning.SetupTuner` on
the pair's main model, each trial draft loaded as the pair's own draft was (the pair's
draft itself reused, not loaded twice), and the ranking remembered for this main model
and machine (:mod:`backends.service.tuning_memory`) unless the trials were cancelled.
Whether a remembered result answers instead of new trials is the front end's choice:
:func:`recall_tuning` says what is remembered and whether the machine changed since.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.service.tuning import SetupTuner, candidate_setups, device_words
from backends.service.tuning_memory import RememberedTuning, TuningMemory, machine_key

if TYPE_CHECKING:
    import threading
    from collections.abc import Sequence

    from backends.engines.interface import ModelEngine
    from backends.models.gguf_info import ModelInfo
    from backends.service.protocol import LoadRequest
    from backends.service.tuning import DraftOpener, TrialPrompt, TuningProgress
    from backends.service.tuning_memory import Recall, TuningKey
    from backends.speculation.planner import CostCache


@dataclass(frozen=True)
class TuningRun:
    """What one round of trials measured, as remembered (unless cancelled)."""

    tuning: RememberedTuning
    cancelled: bool


def tuning_key(request: LoadRequest, main: ModelEngine) -> TuningKey:
    """Under what results for the main model of ``request`` on this machine are remembered."""
    return machine_key(request.main_path, main.load_report, request.engine)


def recall_tuning(key: TuningKey, memory: TuningMemory | None = None) -> Recall | None:
    """The last result for the main model, and what changed on the machine since."""
    return (memory or TuningMemory()).recall(key)


def tune(
    main: ModelEngine,
    open_draft: DraftOpener,
    key: TuningKey,
    drafts: Sequence[ModelInfo],
    prompts: Sequence[TrialPrompt],
    *,
    budget_seconds: float,
    costs: CostCache | None = None,
    remember: bool = True,
    memory: TuningMemory | None = None,
    progress: TuningProgress | None = None,
    cancel: threading.Event | None = None,
) -> TuningRun:
    """Plain decoding, the n-gram methods, auto and every draft in ``drafts``, ranked.

    ``open_draft`` lends each trial its draft model; the main model is left as it was.
    Remembered under ``key`` unless cancelled or ``remember`` is False (a ranking on the
    user's own prompt speaks for that prompt only).
    """
    tuner = SetupTuner(
        main,
        open_draft,
        costs=costs,
        progress=progress,
        cancel=cancel,
        device=device_words(main),
    )
    outcome = tuner.run(candidate_setups(drafts), prompts, budget_seconds=budget_seconds)
    result = RememberedTuning.of(key, outcome)
    if remember and not outcome.cancelled:
        (memory or TuningMemory()).remember(result)
    return TuningRun(result, outcome.cancelled)
