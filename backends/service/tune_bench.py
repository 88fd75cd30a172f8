"""``specdeck-bench --tune``: find the fastest setup for a main model on this machine.

On the main model loaded by the pair service, lists every local model with its verdict as
a draft (the reason in one line for each that cannot draft), runs the service's trials
(:mod:`backends.service.pair_tuning`) over plain decoding, the n-gram methods, auto and
every compatible draft within the time budget, prints the ranking with the theory's
prediction beside each measurement, and remembers the result for this main model and
machine. A remembered result is shown again
instead of measuring while the model file, CPU, device, build and threads stay the same
(``--again`` measures anyway).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from backends.engines.hardware import available_memory
from backends.engines.interface import ChatMessage
from backends.models.catalog import read_catalog_model, scan_models
from backends.models.draft_verdict import draft_verdicts
from backends.service.tuning import TrialPrompt, trial_prompts, winner
from backends.service.tuning_memory import TuningMemory

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.models.draft_verdict import DraftVerdict
    from backends.models.gguf_info import ModelInfo
    from backends.service.loaded_pair import LoadedPair
    from backends.service.tuning import TuningRow
    from backends.service.tuning_memory import RememberedTuning


def run_tune(
    pair: LoadedPair,
    drafts: Sequence[Path] | None,
    *,
    budget_seconds: float,
    prompt: str | None,
    again: bool,
    memory: TuningMemory | None = None,
    progress: TextIO | None = None,
) -> tuple[RememberedTuning, list[DraftVerdict], bool]:
    """Tune (or recall) for the pair's main model; the result, the verdicts, and if recalled.

    ``drafts`` None: every other model in the default folders is a candidate; else only
    those. ``memory`` defaults to the data folder's. A ranking on the user's own ``prompt``
    is measured anew and not remembered: it speaks for that prompt only.
    """
    main_path = pair.request.main_path
    main_info = read_catalog_model(main_path)
    if drafts is None:  # every local model but the main model itself
        candidates: list[ModelInfo] = [
            info for info in scan_models().models if Path(info.path) != Path(main_info.path)
        ]
    else:  # as given (the main model itself too: self-speculation, when asked for)
        candidates = [read_catalog_model(path) for path in drafts]
    memory = memory or TuningMemory()
    verdicts = draft_verdicts(
        main_info,
        candidates,
        free_memory=available_memory(),
        n_ctx=pair.request.n_ctx,
        main_loaded=True,
    )
    recall = pair.recall_tuning(memory)
    if recall is not None and recall.current and not again and prompt is None:
        return recall.tuning, verdicts, True
    if recall is not None and not recall.current and progress is not None:
        print(
            f"measuring again: the last result was measured with {'; '.join(recall.changes)}",
            file=progress,
        )

    def report(fraction: float, message: str) -> None:
        if progress is not None:
            print(f"  {fraction:4.0%}  {message}", file=progress, flush=True)

    usable = [verdict.draft for verdict in verdicts if verdict.can_draft]
    prompts = (
        [TrialPrompt("your prompt", (ChatMessage("user", prompt),))]
        if prompt is not None
        else trial_prompts()
    )
    run = pair.tune(
        usable,
        prompts,
        budget_seconds=budget_seconds,
        remember=prompt is None,
        memory=memory,
        progress=report,
    )
    return run.tuning, verdicts, False


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def format_tuning(
    tuning: RememberedTuning, verdicts: Sequence[DraftVerdict], recalled: bool, main_name: str
) -> str:
    """The ranking table, the reasons, the winner and the drafts' verdicts."""
    key = tuning.key
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(tuning.measured_at))
    lines = [
        f"Fastest setup for {main_name} on {key.cpu.split(' [')[0]}, {key.accelerator}, "
        f"{key.threads} threads ({key.build})",
        f"{len(tuning.prompts)} prompts ({', '.join(tuning.prompts)}), {tuning.trial_tokens} "
        f"tokens each, temperature 0, {tuning.seconds:.0f} s, measured {when}"
        + (" (remembered; --again measures anew)" if recalled else ""),
        "",
        f"   {'setup':<22} {'tok/s':>6} {'× plain':>8} {'spread':>12} {'accepted':>9} "
        f"{'predicted':>10}  same text",
    ]
    for rank, row in enumerate(tuning.rows, start=1):
        if not row.measured:
            lines.append(f"   {row.label:<22} {row.skipped}")
            continue
        spread = row.spread
        spread_text = f"{spread[0]:.2f}–{spread[1]:.2f}×" if spread else "–"
        lines.append(
            f"{rank:>2} {row.label:<22} {row.tokens_per_second:>6.1f} {_times(row.speedup):>8} "
            f"{spread_text:>12} {_percent(row.acceptance_rate):>9} {_times(row.predicted):>10}  "
            f"{'yes' if row.identical else 'NO'}"
        )
    lines.append("")
    lines.append("Why:")
    lines.extend(f"  {row.label}: {row.explanation}" for row in tuning.rows if row.explanation)
    best = winner(tuning.rows)
    if best is not None:
        lines.append("")
        lines.append(f"Fastest: {best.label} ({_times(best.speedup)} plain). {_how_to_use(best)}")
    if verdicts:
        lines.append("")
        lines.append("Drafts:")
        for verdict in verdicts:
            lines.append(f"  {verdict.draft.path.name}: {verdict.summary}")
    return "\n".join(lines)


def _how_to_use(row: TuningRow) -> str:
    if row.method == "off":
        return "Speculation does not pay here: --method off."
    if row.draft_path is None:
        return f"Use: --method {row.method}."
    return f"Use: --method {row.method} --draft {row.draft_path}."


def tuning_json(tuning: RememberedTuning, verdicts: Sequence[DraftVerdict], recalled: bool) -> str:
    """The result as one JSON object."""
    best = winner(tuning.rows)
    data = {
        **tuning.to_json(),
        "recalled": recalled,
        "winner": None if best is None else asdict(best),
        "drafts": [
            {
                "path": str(verdict.draft.path),
                "can_draft": verdict.can_draft,
                "kind": verdict.kind,
                "reason": verdict.reason,
            }
            for verdict in verdicts
        ],
    }
    return json.dumps(data, ensure_ascii=False)


def print_tuning(
    tuning: RememberedTuning,
    verdicts: Sequence[DraftVerdict],
    recalled: bool,
    main_name: str,
    *,
    as_json: bool,
) -> None:
    """Print the result to stdout, as a table or JSON."""
    if as_json:
        print(tuning_json(tuning, verdicts, recalled))
    else:
        print(format_tuning(tuning, verdicts, recalled, main_name))
    sys.stdout.flush()
