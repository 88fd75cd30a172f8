"""How the draft model is run in auto: where it stops, and how much of the prompt it reads.

Loads the default pair once and, for each prompt of the peer benchmark
(:mod:`benchmarks.vs_llama_cpp`), every round decodes plain and then with auto under each
variant, a fresh decoder each time (their order alternating from round to round), from
empty caches, at temperature 0:

- ``p-min, all``: the draft model stops below its p-min (0.75, llama.cpp's rule), waits
  for 4 rounds of the target's confidence and reads the whole prompt (SpecDeck until
  commit 58baec5, 2026-12-02, when the draft also needed a sure target: 0.8 on average,
  dropped in commit 0353cd8, 2026-12-03);
- ``learnt, all``: the planner's learnt stop (``DraftPlanner.stop_rule``), a wait of 8
  rounds, the whole prompt read (SpecDeck from commit 58baec5, 2026-12-02);
- ``learnt, window``: the same, the draft reading only the prompt's head and its last
  tokens (``DraftModelDrafter.reading``; the default).

This machine's speed moves by ±15 % within a minute, so besides the wall-clock ratio
(tokens per second after the first token, over plain's of the same round) every run is
also charged at fixed costs: each forward pass of either model at the cost of its batch
size, measured once at the start (median of 7 after an untimed one, after a 280-token
context; ``--json`` gives them). That "modeled"
ratio is what the planner's choices are worth without the noise, and without the loop's
own time. Medians over the rounds; every speculative text must equal plain's.

    .venv/bin/python -m benchmarks.draft_model_auto [--prompts new-function,prose] [--rounds 6]
        [--max-tokens 160] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.engines.interface import ChatMessage
from backends.engines.weight_placement import cpu_model_name
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path
from backends.service.loaded_pair import open_pair
from backends.service.pair_runs import timed_run
from backends.service.protocol import LoadRequest
from backends.speculation.drafters import DRAFT_READ_WINDOW, DraftModelDrafter
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.planner import CONFIDENCE_ROUNDS, BatchCosts, CostCache
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import GenerationResult, GenerationSettings
from benchmarks.vs_llama_cpp import PROMPTS, PeerPrompt

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.engines.interface import LogitRows, ModelEngine

CONTEXT = 4096
COST_CONTEXT = 280  # about the docstring prompt's length
MAIN_SIZES = (*range(1, 17), 24, 32)
DRAFT_SIZES = (1, 2, 3, 4, 6, 8, 16, 32, 64, COST_CONTEXT)  # the last: its prompt read
COST_REPEATS = 7
WARMUP_TOKENS = 16
_COST_TEXT = "def measure(batch):\n    return sum(x * x for x in batch)  # cost\n" * 60


@dataclass(frozen=True)
class Variant:
    """How the planner is set for one column of the comparison."""

    name: str
    learn_stop: bool
    confidence_rounds: int
    read_window: int | None  # what the draft reads of a long prompt (None: all of it)


VARIANTS = (
    Variant("p-min, all", learn_stop=False, confidence_rounds=4, read_window=None),
    Variant("learnt, all", learn_stop=True, confidence_rounds=CONFIDENCE_ROUNDS, read_window=None),
    Variant(
        "learnt, window",
        learn_stop=True,
        confidence_rounds=CONFIDENCE_ROUNDS,
        read_window=DRAFT_READ_WINDOW,
    ),
)


def measured_costs(engine: ModelEngine, sizes: Sequence[int]) -> BatchCosts:
    """Median seconds of a forward pass per batch size, after a COST_CONTEXT-token context."""
    tokens = engine.tokenize(_COST_TEXT, add_special=False, parse_special=False)
    engine.truncate(0)
    engine.evaluate(tokens[:COST_CONTEXT], 1)
    costs = BatchCosts()
    for size in sizes:
        timings = []
        # The first passes after a load run slower (a draft step took 15 ms, then 9 ms):
        # one untimed pass of each size first.
        for repeat in range(1 + (COST_REPEATS if size <= 32 else 2)):
            engine.truncate(COST_CONTEXT)
            started = time.perf_counter()
            engine.evaluate(tokens[COST_CONTEXT : COST_CONTEXT + size], 1)
            if repeat > 0:
                timings.append(time.perf_counter() - started)
        costs.seconds[size] = statistics.median(timings)
    engine.truncate(0)
    return costs


class ModeledClock:
    """Charges every forward pass of the engines it watches at a fixed cost by batch size."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.running = False

    def watch(self, engine: ModelEngine, costs: BatchCosts) -> None:
        """Count ``engine``'s passes from now on (its evaluate is wrapped on the object)."""
        evaluate = engine.evaluate

        def charged(tokens: Sequence[int], logit_rows: int) -> LogitRows:
            if self.running:
                self.seconds += costs.cost(len(tokens))
            return evaluate(tokens, logit_rows)

        evaluate_with_sibling = engine.evaluate_with_sibling

        def charged_tree(
            tokens: Sequence[int], logit_rows: int, sibling_at: int, sibling: int
        ) -> LogitRows:
            # A batch with a sibling costs what a batch of as many tokens costs (measured,
            # benchmarks/sibling_tree.py).
            if self.running:
                self.seconds += costs.cost(len(tokens) + 1)
            return evaluate_with_sibling(tokens, logit_rows, sibling_at, sibling)

        # The loop, the drafters and the cache helpers all call the engine object's methods.
        setattr(engine, "evaluate", charged)  # noqa: B010
        setattr(engine, "evaluate_with_sibling", charged_tree)  # noqa: B010

    def run(
        self,
        decoder: SpeculativeDecoder,
        engines: Sequence[ModelEngine],
        prompt: Sequence[int],
        settings: GenerationSettings,
    ) -> tuple[GenerationResult, float]:
        """One timed generation and its modeled seconds."""
        self.seconds, self.running = 0.0, True
        try:
            result = timed_run(decoder, engines, prompt, settings)
        finally:
            self.running = False
        return result, self.seconds


def compare_prompt(
    prompt: PeerPrompt,
    engines: tuple[ModelEngine, ModelEngine],
    clock: ModeledClock,
    main_costs: BatchCosts,
    rounds: int,
    max_tokens: int,
) -> dict[str, Any]:
    """Plain and every variant, ``rounds`` times; per variant the ratios of each round."""
    main, draft = engines
    plain = SpeculativeDecoder(main)
    tokens = plain.prompt_tokens([ChatMessage("user", prompt.text)])
    settings = GenerationSettings(sampling=SamplingSettings(temperature=0.0), max_tokens=max_tokens)
    calibrations = CostCache()  # the planners' own calibration, once per engine
    warmup = GenerationSettings(sampling=settings.sampling, max_tokens=WARMUP_TOKENS)
    timed_run(build_decoder("auto", main, draft, cost_cache=calibrations), engines, tokens, warmup)
    # The prompt's pass comes before the first token: neither speed counts it.
    prompt_seconds = main_costs.cost(len(tokens))
    samples: dict[str, dict[str, list[float]]] = {
        v.name: {"wall": [], "modeled": [], "acceptance": []} for v in VARIANTS
    }
    identical = True
    for round_index in range(rounds):
        base, base_seconds = clock.run(plain, engines, tokens, settings)
        order = VARIANTS if round_index % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            decoder = build_decoder("auto", main, draft, cost_cache=calibrations)
            decoder.prepare()
            planner = decoder.planner
            assert planner is not None
            planner.learn_stop = variant.learn_stop
            planner.confidence_rounds = variant.confidence_rounds
            for drafter in decoder.drafters:
                if isinstance(drafter, DraftModelDrafter):
                    drafter.window = variant.read_window
            result, seconds = clock.run(decoder, engines, tokens, settings)
            identical = identical and result.token_ids == base.token_ids
            entry = samples[variant.name]
            entry["wall"].append(result.stats.tokens_per_second / base.stats.tokens_per_second)
            entry["modeled"].append(
                (base_seconds - prompt_seconds) / max(1e-9, seconds - prompt_seconds)
            )
            entry["acceptance"].append(result.stats.acceptance_rate or 0.0)
    return {"kind": prompt.kind, "identical": identical, "variants": samples}


def table(results: dict[str, Any]) -> str:
    """One row per prompt: each variant's median modeled and wall-clock ratio."""
    header = " | ".join(v.name for v in VARIANTS)
    lines = [
        f"{results['machine']}, {results['rounds']} round(s), {results['max_tokens']} tokens; "
        "modeled / wall-clock ratio over plain (medians), acceptance range",
        f"| prompt | {header} | identical |",
        "|---" * (len(VARIANTS) + 2) + "|",
    ]
    for key, entry in results["prompts"].items():
        cells = []
        for variant in VARIANTS:
            sample = entry["variants"][variant.name]
            accepted = sample["acceptance"]
            cells.append(
                f"{statistics.median(sample['modeled']):.2f}× / "
                f"{statistics.median(sample['wall']):.2f}× "
                f"({100 * min(accepted):.0f}–{100 * max(accepted):.0f} %)"
            )
        same = "yes" if entry["identical"] else "TEXT DIFFERS"
        lines.append(f"| {key} ({entry['kind']}) | {' | '.join(cells)} | {same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure the variants on the chosen prompts and print the table (or JSON)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.draft_model_auto")
    parser.add_argument("--prompts", default=",".join(p.key for p in PROMPTS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    by_key = {p.key: p for p in PROMPTS}
    unknown = [key for key in args.prompts.split(",") if key not in by_key]
    if unknown:
        parser.error(f"unknown prompt {', '.join(unknown)} (known: {', '.join(by_key)})")
    if args.rounds < 1 or args.max_tokens < 2:
        parser.error("--rounds must be at least 1 and --max-tokens at least 2")
    results: dict[str, Any] = {
        "machine": cpu_model_name() or "unknown CPU",
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "prompts": {},
    }
    # "off": no calibration at load; the variants calibrate their own planners.
    request = LoadRequest(
        str(model_path(DEFAULT_MAIN_KEY)),
        str(model_path(DEFAULT_DRAFT_KEY)),
        method="off",
        n_ctx=CONTEXT,
    )
    with open_pair(request) as pair:
        main_engine, draft_engine = pair.main, pair.draft
        assert draft_engine is not None
        clock = ModeledClock()
        main_costs = measured_costs(main_engine, MAIN_SIZES)
        draft_costs = measured_costs(draft_engine, DRAFT_SIZES)
        results["costs_ms"] = {
            "main": {size: round(1000 * s, 2) for size, s in main_costs.seconds.items()},
            "draft": {size: round(1000 * s, 2) for size, s in draft_costs.seconds.items()},
        }
        clock.watch(main_engine, main_costs)
        clock.watch(draft_engine, draft_costs)
        for key in args.prompts.split(","):
            results["prompts"][key] = compare_prompt(
                by_key[key],
                (main_engine, draft_engine),
                clock,
                main_costs,
                args.rounds,
                args.max_tokens,
            )
    print(json.dumps(results, indent=2) if args.json else table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
