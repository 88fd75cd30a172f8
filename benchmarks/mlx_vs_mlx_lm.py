"""Our speculative loop on the MLX engine against mlx-lm's own stream_generate(draft_model=...).

Same folders, same prompt tokens, same fixed draft length k, float32 activations on the CPU
for both. Both read the prompt with both models once, at different moments: mlx-lm reads it
with the draft and the main model before its first token; our loop answers the first token
from the main model alone and lets the draft read the prompt in the next round. So each run
is reported three ways, measured the same way for both sides:

- ``end_to_end_tok_s``: generated tokens / seconds from the call to the last token (all the
  work, both prompt reads included: the figure a user waits for);
- ``ttft_s``: seconds to the first token;
- ``steady_tok_s``: tokens after the first two rounds / the seconds they took (decoding
  with both models caught up; no prompt reading on either side).

``ours_auto`` is SpecDeck's default method on the same pair: the planner picks the draft
model, an n-gram lookup or plain decoding each round from measured costs (calibrated before
the run, as the app does at load).

At a temperature > 0 it also reports the acceptance of rejection sampling against
sample-and-match (mlx-lm's verification; our loop can verify either way) and mlx-lm's share
of drafted output.

    .venv/bin/python benchmarks/mlx_vs_mlx_lm.py --main DIR --draft DIR [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from backends.engines.interface import ChatMessage
from backends.engines.mlx import MlxEngine
from backends.speculation.drafters import DraftModelDrafter
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import GenerationSettings

DEFAULT_PROMPT = "Write a quicksort function in Python."
STEADY_AFTER_ROUNDS = 2  # rounds left out of the steady rate (prompt reads, first draft)


def timing(started: float, rounds: list[tuple[float, int]]) -> dict[str, float]:
    """The three speeds of one run from (time, tokens) at the end of each round."""
    tokens = sum(count for _, count in rounds)
    total = rounds[-1][0] - started
    steady_from = rounds[STEADY_AFTER_ROUNDS - 1][0] if len(rounds) > STEADY_AFTER_ROUNDS else 0
    steady_tokens = sum(count for _, count in rounds[STEADY_AFTER_ROUNDS:])
    steady_seconds = rounds[-1][0] - steady_from
    return {
        "tokens": tokens,
        "ttft_s": rounds[0][0] - started,
        "total_s": total,
        "end_to_end_tok_s": tokens / total,
        "steady_tok_s": steady_tokens / steady_seconds if steady_tokens else 0.0,
    }


def mlx_lm_run(
    model: Any, draft: Any, tokenizer: Any, prompt: list[int], args: argparse.Namespace, temp: float
) -> dict[str, Any]:
    """One mlx-lm generation: its speeds and the share of drafted tokens."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(args.seed)
    rounds: list[tuple[float, int]] = []
    in_round = 0
    drafted = 0
    kwargs: dict[str, Any] = {}
    if draft is not None:
        kwargs = {"draft_model": draft, "num_draft_tokens": args.draft_max}
    started = time.perf_counter()
    ids: list[int] = []
    for response in stream_generate(
        model,
        tokenizer,
        prompt,
        max_tokens=args.max_tokens,
        sampler=make_sampler(temp=temp),
        **kwargs,
    ):
        from_draft = bool(getattr(response, "from_draft", False))
        if response.finish_reason == "stop":  # the end-of-generation token: not text
            rounds.append((time.perf_counter(), in_round))
            in_round = 0
            break
        drafted += int(from_draft)
        ids.append(int(response.token))
        in_round += 1
        if not from_draft:  # every round ends with one token of the main model's own
            rounds.append((time.perf_counter(), in_round))
            in_round = 0
    if in_round:
        rounds.append((time.perf_counter(), in_round))
    result: dict[str, Any] = timing(started, rounds)
    result["draft_share"] = drafted / max(1, result["tokens"])
    result["ids"] = ids
    return result


def to_float32(model: Any) -> None:
    """The MLX engine's CPU treatment, so both sides run the same arithmetic."""
    import mlx.core as mx
    from mlx.utils import tree_map

    if mx.default_device() == mx.cpu:
        model.update(
            tree_map(
                lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p,
                model.parameters(),
            )
        )


def main() -> None:
    """Run both and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--draft-max", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from mlx_lm import load

    main_engine = MlxEngine(args.main)
    draft_engine = MlxEngine(args.draft, is_draft=True)
    decoder = SpeculativeDecoder(main_engine, DraftModelDrafter(draft_engine, p_min=0.0))
    plain = SpeculativeDecoder(main_engine)
    auto = build_decoder("auto", main_engine, draft_engine)
    auto.prepare()
    prompt = plain.prompt_tokens([ChatMessage("user", args.prompt)])

    def ours(
        decoding: SpeculativeDecoder, temp: float, verification: str, seed: int
    ) -> dict[str, Any]:
        main_engine.truncate(0)
        draft_engine.truncate(0)
        settings = GenerationSettings(
            max_tokens=args.max_tokens,
            sampling=SamplingSettings(temperature=temp, seed=seed),
            draft_max=args.draft_max,
            p_min=0.0,
            verification=verification,  # type: ignore[arg-type]
        )
        rounds: list[tuple[float, int]] = []
        ids: list[int] = []
        started = time.perf_counter()
        stats = None
        for update in decoding.generate(prompt, settings):
            if update.tokens or not update.finished:
                rounds.append((time.perf_counter(), len(update.tokens)))
            ids.extend(token.token_id for token in update.tokens)
            stats = update.stats
        assert stats is not None
        result: dict[str, Any] = timing(started, rounds)
        result["acceptance"] = stats.acceptance_rate
        result["rounds_by_method"] = stats.rounds_by_method
        result["draft_share"] = stats.accepted_draft_tokens_count / max(1, stats.generated_tokens)
        result["ids"] = ids
        return result

    model, tokenizer = load(str(args.main))[:2]
    draft_model = load(str(args.draft))[0]
    to_float32(model)
    to_float32(draft_model)
    ours(decoder, 0.0, "rejection", 0)  # warm-up
    mlx_lm_run(model, draft_model, tokenizer, prompt, args, 0.0)
    report: dict[str, Any] = {
        "main": main_engine.name,
        "draft": draft_engine.name,
        "placement": main_engine.load_report.placement,
        "k": args.draft_max,
        "max_tokens": args.max_tokens,
    }
    runs = {
        "ours_plain": ours(plain, 0.0, "rejection", 0),
        "ours_spec": ours(decoder, 0.0, "rejection", 0),
        "ours_auto": ours(auto, 0.0, "rejection", 0),
        "mlx_lm_plain": mlx_lm_run(model, None, tokenizer, prompt, args, 0.0),
        "mlx_lm_spec": mlx_lm_run(model, draft_model, tokenizer, prompt, args, 0.0),
    }
    reference = runs["ours_plain"]["ids"]
    report["identical_to_ours_plain"] = {name: r["ids"] == reference for name, r in runs.items()}
    report["ours_greedy_acceptance"] = runs["ours_spec"]["acceptance"]
    for name, run in runs.items():
        run.pop("ids")
        report[name] = run
    temp = args.temperature
    rows: dict[str, list[dict[str, Any]]] = {"rejection": [], "sample-match": [], "mlx_lm": []}
    for seed in range(args.seeds):
        for verification in ("rejection", "sample-match"):
            run = ours(decoder, temp, verification, seed)
            run.pop("ids")
            rows[verification].append(run)
        args.seed = seed
        run = mlx_lm_run(model, draft_model, tokenizer, prompt, args, temp)
        run.pop("ids")
        rows["mlx_lm"].append(run)
    report[f"temperature_{temp:g}"] = rows
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
