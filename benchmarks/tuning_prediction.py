"""How close "Find my fastest setup"'s theory comes to the measurement, on the suite.

Loads the main model (the default pair's unless given) and runs the tuner, as the window
and ``specdeck-bench --tune`` do, on every suite prompt with every setup (plain, the n-gram
methods, auto, and the draft model alone and under auto), with a budget large enough for
all of them. For each setup it prints the measured speedup over plain decoding (geometric
mean over the prompts), the predicted one (Leviathan et al.'s expected tokens per round
from the acceptance at each position, the draft step's cost and the calibrated verify
costs) and the relative error; then the mean and largest error. Nothing is remembered.

    .venv/bin/python -m benchmarks.tuning_prediction [--main M.gguf] [--draft D.gguf]
        [--max-tokens 96] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from backends.engines.interface import ChatMessage
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.weight_placement import cpu_model_name
from backends.models.catalog import read_catalog_model
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path
from backends.service.suite_prompts import SUITE_PROMPTS
from backends.service.tuning import SetupTuner, TrialPrompt, candidate_setups, device_words

if TYPE_CHECKING:
    from collections.abc import Iterator

    from backends.engines.interface import ModelEngine
    from backends.models.gguf_info import ModelInfo

CONTEXT = 4096
BUDGET_SECONDS = 3600.0  # every setup on every prompt: the budget must not cut anything


def main(argv: list[str] | None = None) -> int:
    """Run the tuner on the suite and print measured against predicted speedups."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tuning_prediction")
    parser.add_argument("--main", type=Path, default=None)
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    main_path = args.main or model_path(DEFAULT_MAIN_KEY)
    draft_path = args.draft or model_path(DEFAULT_DRAFT_KEY)
    settings = LlamaLoadSettings(n_ctx=CONTEXT, n_threads=args.threads)

    @contextlib.contextmanager
    def open_draft(info: ModelInfo) -> Iterator[ModelEngine]:
        with LlamaEngine(info.path, settings, is_draft=True) as draft:
            yield draft

    prompts = [
        TrialPrompt(prompt.key, (ChatMessage("user", prompt.text),)) for prompt in SUITE_PROMPTS
    ]
    with LlamaEngine(main_path, settings) as main_engine:
        tuner = SetupTuner(
            main_engine,
            open_draft,
            device=device_words(main_engine),
            progress=lambda fraction, what: print(f"  {fraction:4.0%} {what}", file=sys.stderr),
        )
        setups = candidate_setups([read_catalog_model(draft_path)])
        outcome = tuner.run(
            setups, prompts, budget_seconds=BUDGET_SECONDS, max_tokens=args.max_tokens
        )
        threads = main_engine.load_report.n_threads
    compared = [
        (row.label, row.speedup, row.predicted, row.acceptance_rate, row.identical)
        for row in outcome.rows
        if row.method != "off" and row.speedup is not None and row.predicted is not None
    ]
    errors = [abs(predicted / measured - 1) for _, measured, predicted, _, _ in compared]
    machine = f"{cpu_model_name()}, {threads} threads"
    if args.json:
        summary = {
            "machine": machine,
            "prompts": outcome.prompts,
            "tokens": outcome.trial_tokens,
            "rows": [
                {
                    "setup": label,
                    "measured": measured,
                    "predicted": predicted,
                    "error": predicted / measured - 1,
                    "acceptance": accepted,
                    "identical": identical,
                }
                for label, measured, predicted, accepted, identical in compared
            ],
            "mean_abs_error": statistics.fmean(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
        }
        print(json.dumps(summary))
        return 0
    print(f"{machine}; prompts {', '.join(outcome.prompts)}; {outcome.trial_tokens} tokens")
    print(f"{'setup':<22} {'measured':>9} {'predicted':>10} {'error':>7} {'accepted':>9}  same")
    for label, measured, predicted, accepted, identical in compared:
        shown = "–" if accepted is None else f"{accepted:.0%}"
        print(
            f"{label:<22} {measured:>8.2f}× {predicted:>9.2f}× {predicted / measured - 1:>+7.0%} "
            f"{shown:>9}  {'yes' if identical else 'NO'}"
        )
    if errors:
        print(f"mean |error| {statistics.fmean(errors):.0%}, largest {max(errors):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
