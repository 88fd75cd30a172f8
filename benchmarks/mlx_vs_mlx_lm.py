"""Our speculative loop on the MLX engine against mlx-lm's own stream_generate(draft_model=...).

Same folders, same prompt tokens, same fixed draft length k, float32 activations on the CPU
for both. Reports tok/s (after the first token) of plain and speculative decoding for both,
and, at a temperature > 0, the acceptance of rejection sampling against sample-and-match
(mlx-lm's verification; our loop can verify either way) and mlx-lm's share of drafted output.

    .venv/bin/python benchmarks/mlx_vs_mlx_lm.py --main DIR --draft DIR [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from backends.engine import ChatMessage
from backends.mlx_engine import MlxEngine
from backends.sampling import SamplingSettings
from backends.speculative import DraftModelDrafter, GenerationSettings, SpeculativeDecoder

DEFAULT_PROMPT = "Write a quicksort function in Python."


def mlx_lm_run(
    model: Any, draft: Any, tokenizer: Any, prompt: list[int], args: argparse.Namespace, temp: float
) -> dict[str, float]:
    """One mlx-lm generation; tok/s after the first token and the share of drafted tokens."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(args.seed)
    times: list[float] = []
    drafted = 0
    kwargs: dict[str, Any] = {}
    if draft is not None:
        kwargs = {"draft_model": draft, "num_draft_tokens": args.draft_max}
    for response in stream_generate(
        model,
        tokenizer,
        prompt,
        max_tokens=args.max_tokens,
        sampler=make_sampler(temp=temp),
        **kwargs,
    ):
        times.append(time.perf_counter())
        drafted += int(bool(getattr(response, "from_draft", False)))
    generated = len(times)
    speed = (generated - 1) / (times[-1] - times[0]) if generated > 1 else 0.0
    return {"tokens": generated, "tok_s": speed, "draft_share": drafted / max(1, generated)}


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
    prompt = plain.prompt_tokens([ChatMessage("user", args.prompt)])

    def ours(spec: bool, temp: float, verification: str, seed: int) -> dict[str, Any]:
        main_engine.truncate(0)
        draft_engine.truncate(0)
        settings = GenerationSettings(
            max_tokens=args.max_tokens,
            sampling=SamplingSettings(temperature=temp, seed=seed),
            draft_max=args.draft_max,
            p_min=0.0,
            verification=verification,  # type: ignore[arg-type]
        )
        result = (decoder if spec else plain).run(prompt, settings)
        stats = result.stats
        return {
            "tokens": stats.generated_tokens,
            "tok_s": stats.tokens_per_second,
            "acceptance": stats.acceptance_rate,
            "draft_share": stats.accepted_draft_tokens_count / max(1, stats.generated_tokens),
            "ids": result.token_ids,
        }

    model, tokenizer = load(str(args.main))[:2]
    draft_model = load(str(args.draft))[0]
    to_float32(model)
    to_float32(draft_model)
    ours(True, 0.0, "rejection", 0)  # warm-up
    mlx_lm_run(model, draft_model, tokenizer, prompt, args, 0.0)
    report: dict[str, Any] = {
        "main": main_engine.name,
        "draft": draft_engine.name,
        "placement": main_engine.load_report.placement,
        "k": args.draft_max,
        "max_tokens": args.max_tokens,
    }
    greedy_plain = ours(False, 0.0, "rejection", 0)
    greedy_spec = ours(True, 0.0, "rejection", 0)
    report["ours_plain_tok_s"] = greedy_plain["tok_s"]
    report["ours_spec_tok_s"] = greedy_spec["tok_s"]
    report["ours_identical"] = greedy_plain["ids"] == greedy_spec["ids"]
    report["ours_greedy_acceptance"] = greedy_spec["acceptance"]
    report["mlx_lm_plain"] = mlx_lm_run(model, None, tokenizer, prompt, args, 0.0)
    report["mlx_lm_spec"] = mlx_lm_run(model, draft_model, tokenizer, prompt, args, 0.0)
    temp = args.temperature
    rows: dict[str, list[dict[str, Any]]] = {"rejection": [], "sample-match": [], "mlx_lm": []}
    for seed in range(args.seeds):
        for verification in ("rejection", "sample-match"):
            run = ours(True, temp, verification, seed)
            run.pop("ids")
            rows[verification].append(run)
        args.seed = seed
        rows["mlx_lm"].append(mlx_lm_run(model, draft_model, tokenizer, prompt, args, temp))
    report[f"temperature_{temp:g}"] = rows
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
