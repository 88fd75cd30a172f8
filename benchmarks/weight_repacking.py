"""Weight repacking on vs off on one model: decode tok/s, prompt tok/s, batch costs, exact batches.

llama.cpp repacks CPU weights for faster kernels (SpecDeck never lets it use AMX, see
backends/weight_placement.py); in stock llama.cpp the price is batched logits that stop
matching single-token logits from 4 rows on, which caps exact verification (SpecDeck's
build removes that, see benchmarks/exact_batches.py). This measures both sides in one run,
alternating the two loads so that machine noise hits both alike:

- ``decode_tok_s``: single-token greedy steps after a short prompt;
- ``prompt_tok_s``: one prompt of ``--prompt-tokens`` tokens read in n_batch chunks;
- ``batch_ms``: the cost of a batch of 1, 2, 3, 4, 8 and 16 tokens after that prompt;
- ``exact_batch_limit``: the largest batch whose logits equal single-token logits bit for
  bit (the load-time probe, batches of 2 to 17; 63 means every probed size).

    .venv/bin/python -m benchmarks.weight_repacking [--model FILE] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.weight_placement import cpu_model_name, has_amx
from backends.models.provision import DEFAULT_MAIN_KEY, model_path
from benchmarks.exact_batches import batch_costs, decode_rate

BATCH_SIZES = (1, 2, 3, 4, 8, 16)
DECODE_STEPS = 48
TEXT = "def merge(left, right):\n    result = []\n    while left and right:\n"


def measure(path: Path, mode: str, prompt_tokens: int, threads: int | None) -> dict[str, Any]:
    """One load with ``mode`` ("on" or "off") and its figures."""
    settings = LlamaLoadSettings(n_ctx=2048, weight_repacking=mode, n_threads=threads)  # type: ignore[arg-type]
    with LlamaEngine(path, settings) as engine:
        words = engine.tokenize(TEXT * 64, add_special=False, parse_special=False)
        prompt = words[:prompt_tokens]
        engine.truncate(0)
        began = time.perf_counter()
        engine.evaluate(prompt, 1)
        prompt_seconds = time.perf_counter() - began
        batch_ms = batch_costs(engine, words, len(prompt), BATCH_SIZES)
        decode_tok_s = decode_rate(engine, words, DECODE_STEPS)
        return {
            "mode": mode,
            "note": next((n for n in engine.load_report.notes if "repacking" in n), ""),
            "weight_buffers": list(engine.load_report.weight_buffers),
            "decode_tok_s": round(decode_tok_s, 2),
            "prompt_tok_s": round(len(prompt) / prompt_seconds, 1),
            "batch_ms": batch_ms,
            "exact_batch_limit": engine.exact_batch_limit,
        }


def main() -> None:
    """Alternate loads with repacking on and off; print a table or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the default main")
    parser.add_argument("--rounds", type=int, default=2, help="loads per mode, alternated")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    path = args.model or model_path(DEFAULT_MAIN_KEY)
    runs = [
        measure(path, mode, args.prompt_tokens, args.threads)
        for _ in range(args.rounds)
        for mode in ("on", "off")
    ]
    machine = f"{cpu_model_name()} ({'with' if has_amx() else 'without'} AMX)"
    if args.json:
        print(json.dumps({"model": path.name, "cpu": machine, "runs": runs}))
        return
    print(f"{path.name} on {machine}")
    sizes = "  ".join(f"{size:>5}" for size in BATCH_SIZES)
    print(f"{'repack':6} {'decode':>8} {'prompt':>8}  batch ms: {sizes}  exact  buffers")
    for run in runs:
        costs = "  ".join(f"{run['batch_ms'][str(size)]:5.0f}" for size in BATCH_SIZES)
        print(
            f"{run['mode']:6} {run['decode_tok_s']:8.2f} {run['prompt_tok_s']:8.1f}  "
            f"          {costs}  {run['exact_batch_limit']:>5}  {','.join(run['weight_buffers'])}"
        )


if __name__ == "__main__":
    main()
