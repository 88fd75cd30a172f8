"""The draft model's second choice as a sibling branch: exact, and what it is worth.

A verification batch may hold, besides the draft's chain, the draft model's second choice at
one position in a second sequence sharing the cache (``ModelEngine.evaluate_with_sibling``).
Where the target refuses the chain there and takes the second choice, the sibling's row
gives one more token in the same round. Two measurements on the default pair (llama.cpp,
temperature 0):

1. **Exactness and cost.** After a plain greedy answer to the prose prompt, at every 6th
   answer position a batch holds a chain with a wrong token at depth d (0, 1, 2) and the
   right token as its sibling. The chain's rows before the branch and the sibling's row
   must equal plain decoding's logits bit for bit, and so must plain decoding after the
   branch (its cells must leave the cache in order). Prints the checks and the cost of
   batches with a sibling by their size, against plain batches of the same size.
2. **Speed.** Per prompt and round, from empty caches: plain decoding, auto without
   siblings and auto with them (a fresh decoder each, the order rotating from round to
   round, one cost calibration shared), every text compared with plain's. Prints median
   ratios to plain, by the wall clock and "modeled" (every forward pass charged at a cost
   measured once by batch size, as in :mod:`benchmarks.draft_model_auto`: the noise-free
   figure of what the choices are worth), and how many siblings were taken.

    .venv/bin/python -m benchmarks.sibling_tree [--prompts prose,docstrings] [--rounds 3]
        [--max-tokens 160]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import numpy as np

from backends.engines.interface import ChatMessage, sync_cache
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.weight_placement import cpu_model_name
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.planner import BatchCosts, CostCache
from backends.speculation.types import GenerationSettings
from benchmarks.draft_model_auto import DRAFT_SIZES, MAIN_SIZES, ModeledClock, measured_costs
from benchmarks.vs_llama_cpp import PROMPTS

CONTEXT = 1024
EXACT_ANSWER_TOKENS = 90
EXACT_EVERY = 6
SIBLING_DEPTHS = (0, 1, 2)
COST_REPEATS = 5


def check_exactness(main: LlamaEngine, text: str) -> None:
    """Part 1: sibling rows and the cache after them against plain decoding, bitwise."""
    prompt = SpeculativeDecoder(main).prompt_tokens([ChatMessage("user", text)])
    main.truncate(0)
    plain_rows = [main.evaluate(prompt, 1)[0].copy()]  # plain_rows[i] predicts answer[i]
    answer: list[int] = []
    for _ in range(EXACT_ANSWER_TOKENS):
        answer.append(int(np.argmax(plain_rows[-1])))
        plain_rows.append(main.evaluate(answer[-1:], 1)[0].copy())
    base = len(prompt)
    exact = differ = 0
    for at in range(0, EXACT_ANSWER_TOKENS - 10, EXACT_EVERY):
        for depth in SIBLING_DEPTHS:
            sync_cache(main, [*prompt, *answer[:at]])
            wrong = (answer[at + depth] + 7) % main.vocab.n_vocab
            chain = [*answer[at : at + depth], wrong, *answer[at + depth + 1 : at + depth + 3]]
            rows = main.evaluate_with_sibling(chain, len(chain), depth, answer[at + depth])
            pairs = [(rows[i].copy(), plain_rows[at + i + 1]) for i in range(depth)]
            pairs.append((rows[-1].copy(), plain_rows[at + depth + 1]))
            main.truncate(base + at)
            after = main.evaluate(answer[at : at + depth + 3], depth + 3)
            pairs += [(after[i].copy(), plain_rows[at + i + 1]) for i in range(depth + 3)]
            for ours, plain in pairs:
                if np.array_equal(ours, plain):
                    exact += 1
                else:
                    differ += 1
    print(f"sibling rows and the rows after them: {exact} bit-exact, {differ} differ")
    for size in (2, 3, 4, 5, 6, 8):
        with_sibling, plain_batch = [], []
        for _ in range(COST_REPEATS):
            main.truncate(base)
            started = time.perf_counter()
            main.evaluate_with_sibling(answer[: size - 1], size - 1, 0, answer[1])
            with_sibling.append(time.perf_counter() - started)
            main.truncate(base)
            started = time.perf_counter()
            main.evaluate(answer[:size], size)
            plain_batch.append(time.perf_counter() - started)
        print(
            f"batch of {size} tokens: {1000 * statistics.median(plain_batch):.1f} ms, "
            f"{size - 1} + a sibling: {1000 * statistics.median(with_sibling):.1f} ms"
        )
    main.truncate(0)


def measure_speed(
    engines: tuple[LlamaEngine, LlamaEngine],
    clock: ModeledClock,
    main_costs: BatchCosts,
    key: str,
    text: str,
    rounds: int,
    max_tokens: int,
) -> None:
    """Part 2: plain, auto without and with siblings, rotating, ratios to plain."""
    main, draft = engines
    calibrations = CostCache()  # the planners' own calibration, shared
    plain = SpeculativeDecoder(main)
    prompt = plain.prompt_tokens([ChatMessage("user", text)])
    prompt_seconds = main_costs.cost(len(prompt))  # before the first token: not counted
    settings = GenerationSettings(max_tokens=max_tokens)
    variants = {
        "plain": settings,
        "auto, no siblings": replace(settings, sibling_branches=False),
        "auto": replace(settings, sibling_branches=True),
    }
    wall: dict[str, list[float]] = {name: [] for name in variants}
    modeled: dict[str, list[float]] = {name: [] for name in variants}
    siblings: list[str] = []
    texts: set[tuple[int, ...]] = set()
    for round_index in range(rounds):
        names = list(variants)
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            decoder = (
                plain
                if name == "plain"
                else build_decoder("auto", main, draft, cost_cache=calibrations)
            )
            decoder.prepare()  # the planner's calibration, outside the clock
            result, seconds = clock.run(decoder, engines, prompt, variants[name])
            texts.add(tuple(result.token_ids))
            wall[name].append(result.stats.tokens_per_second)
            modeled[name].append(max(1e-9, seconds - prompt_seconds))
            if name == "auto":
                stats = result.stats
                siblings.append(
                    f"{stats.accepted_sibling_tokens_count}/{stats.sibling_tokens_count}"
                )

    def ratio(name: str) -> str:
        by_wall = [s / p for s, p in zip(wall[name], wall["plain"], strict=True)]
        by_model = [p / s for s, p in zip(modeled[name], modeled["plain"], strict=True)]
        return f"{statistics.median(by_model):.3f}× / {statistics.median(by_wall):.2f}×"

    print(
        f"{key}: plain {statistics.median(wall['plain']):.1f} tok/s; modeled / wall-clock "
        f"ratio to plain (medians of {rounds}): auto without siblings "
        f"{ratio('auto, no siblings')}, with siblings {ratio('auto')}; siblings taken / "
        f"verified per run: {', '.join(siblings)}; text "
        f"{'identical to plain' if len(texts) == 1 else 'DIFFERS FROM PLAIN'}"
    )


def main() -> None:
    """Run both parts and print what they found."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--prompts", default="prose,docstrings,new-function")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    texts = {p.key: p.text for p in PROMPTS}
    wanted = args.prompts.split(",")
    unknown = sorted(set(wanted) - set(texts))
    if unknown:
        parser.error(f"unknown prompt {', '.join(unknown)} (known: {', '.join(texts)})")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    with (
        LlamaEngine(model_path(DEFAULT_MAIN_KEY), LlamaLoadSettings(n_ctx=CONTEXT)) as main,
        LlamaEngine(
            model_path(DEFAULT_DRAFT_KEY), LlamaLoadSettings(n_ctx=CONTEXT), is_draft=True
        ) as draft,
    ):
        print(
            f"{cpu_model_name()}, default pair, temperature 0; sibling branches "
            f"{'exact' if main.exact_siblings else 'NOT EXACT (off)'} on this engine"
        )
        if not main.exact_siblings:
            return
        check_exactness(main, texts["prose"])
        main_costs = measured_costs(main, MAIN_SIZES)
        clock = ModeledClock()
        clock.watch(main, main_costs)
        clock.watch(draft, measured_costs(draft, DRAFT_SIZES))
        for key in wanted:
            measure_speed(
                (main, draft), clock, main_costs, key, texts[key], args.rounds, args.max_tokens
            )


if __name__ == "__main__":
    main()
