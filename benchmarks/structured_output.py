"""Structured output: SpecDeck auto under a grammar against plain constrained decoding.

Each prompt comes with a JSON schema, as an API client sends it in ``response_format``:
an extraction (the values are in a document in the prompt, so the lookups can copy them)
and a function call's arguments. On one load of the pair, each round answers plain, auto,
auto, plain with the schema's grammar, at temperature 0 (each auto answer on a fresh
decoder sharing the load's batch costs, as ``specdeck-bench`` does, so no answer copies an
earlier one); auto's speed over plain's is the mean of its two answers over plain's two,
so a drift of the machine that is steady over the four cancels. It reports per prompt
auto over plain (every round, and the median), whether every text was plain constrained
decoding's, the tokens the grammar allowed alone (verified with no drafting) and the
drafted tokens accepted.

    .venv/bin/python -m benchmarks.structured_output [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backends.engines.hardware import physical_cores
from backends.engines.interface import ChatMessage
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path
from backends.speculation.estimates import CostCache
from backends.speculation.grammar import compile_grammar
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.types import GenerationSettings
from benchmarks.never_slower import machine_line

if TYPE_CHECKING:
    from backends.speculation.types import GenerationResult


@dataclass(frozen=True)
class SchemaPrompt:
    """A user message and the JSON schema its answer must follow."""

    key: str
    text: str
    schema: dict[str, Any]


INVOICE = """\
INVOICE 2026-0412
Billed to: Marta Kowalczyk, Northwind Bicycles, 14 Harbour Street, Gdansk
Date: 3 November 2026
- 2 x Shimano Deore chain, 24.90 each
- 1 x Schwalbe Marathon tyre 28 inch, 31.50
- 4 x brake pads (disc, resin), 6.75 each
Shipping: 9.00
Total due: 118.30 EUR, payable within 14 days."""

PROMPTS = (
    SchemaPrompt(
        "extraction",
        "Extract the invoice below as JSON.\n\n" + INVOICE,
        {
            "type": "object",
            "properties": {
                "invoice_number": {"type": "string"},
                "customer": {"type": "string"},
                "company": {"type": "string"},
                "date": {"type": "string"},
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "description": {"type": "string"},
                            "quantity": {"type": "integer"},
                            "unit_price": {"type": "number"},
                        },
                        "required": ["description", "quantity", "unit_price"],
                        "additionalProperties": False,
                    },
                },
                "shipping": {"type": "number"},
                "total": {"type": "number"},
                "currency": {"type": "string"},
            },
            "required": [
                "invoice_number",
                "customer",
                "company",
                "date",
                "items",
                "shipping",
                "total",
                "currency",
            ],
            "additionalProperties": False,
        },
    ),
    SchemaPrompt(
        "function-call",
        "You can call get_weather(city, country_code, unit, days). Call it for this request: "
        "what will the weather be like in Lyon, France over the next three days, in Celsius?",
        {
            "type": "object",
            "properties": {
                "name": {"const": "get_weather"},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "country_code": {"type": "string", "pattern": "^[A-Z]{2}$"},
                        "unit": {"enum": ["celsius", "fahrenheit"]},
                        "days": {"type": "integer", "minimum": 1, "maximum": 14},
                    },
                    "required": ["city", "country_code", "unit", "days"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        },
    ),
)


@dataclass
class PromptResult:
    """One prompt's rounds."""

    key: str
    speedups: list[float] = field(default_factory=list)  # auto over plain, per round
    identical: bool = True
    tokens: int = 0  # of the answer
    grammar_tokens: list[int] = field(default_factory=list)  # per auto answer
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    text: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.speedups)


def answer(
    decoder: SpeculativeDecoder, prompt: list[int], settings: GenerationSettings
) -> GenerationResult:
    """One answer from empty caches."""
    decoder.target.truncate(0)
    for drafter in decoder.drafters:
        if drafter.engine is not None:
            drafter.engine.truncate(0)
    return decoder.run(prompt, settings)


def run_prompt(
    main: LlamaEngine,
    draft: LlamaEngine,
    prompt: SchemaPrompt,
    rounds: int,
    max_tokens: int,
    cost_cache: CostCache,
) -> PromptResult:
    """``rounds`` of plain, auto, auto, plain under the prompt's schema."""
    settings = GenerationSettings(
        max_tokens=max_tokens, grammar=compile_grammar("json_schema", prompt.schema)
    )
    plain = SpeculativeDecoder(main)
    tokens = plain.prompt_tokens([ChatMessage("user", prompt.text)])
    result = PromptResult(prompt.key)
    for _ in range(rounds):
        plain_seconds: list[float] = []
        auto_seconds: list[float] = []
        for kind in ("plain", "auto", "auto", "plain"):
            if kind == "plain":
                done = answer(plain, tokens, settings)
                plain_seconds.append(done.stats.total_seconds)
                result.text = result.text or done.text
                result.identical &= done.text == result.text
                result.tokens = done.stats.generated_tokens
                continue
            decoder = build_decoder("auto", main, draft, cost_cache=cost_cache)
            done = answer(decoder, tokens, settings)
            auto_seconds.append(done.stats.total_seconds)
            result.identical &= done.text == result.text
            result.grammar_tokens.append(done.stats.grammar_tokens_count)
            result.drafted.append(done.stats.total_draft_tokens_count)
            result.accepted.append(done.stats.accepted_draft_tokens_count)
        result.speedups.append(sum(plain_seconds) / sum(auto_seconds))
    return result


def format_table(results: list[PromptResult], line: str, rounds: int) -> str:
    """The Markdown table of the run."""
    rows = [
        f"{line}; {rounds} rounds a prompt, each plain, auto, auto, plain on one load, "
        "temperature 0, the schema's grammar on every answer",
        "",
        "| prompt | auto over plain (median) | every round | tokens | by the grammar alone "
        "| drafted tokens accepted | identical |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        accepted = sum(r.accepted) / max(1, sum(r.drafted))
        rows.append(
            f"| {r.key} | {r.median:.2f}x | {' '.join(f'{s:.2f}' for s in r.speedups)} "
            f"| {r.tokens} | {statistics.median(r.grammar_tokens):.0f} "
            f"| {accepted:.0%} of {statistics.median(r.drafted):.0f} | "
            f"{'yes' if r.identical else 'NO'} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (1 where a text differed from plain's)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.structured_output")
    parser.add_argument("--main", type=Path, default=None, help="default: the default pair's")
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--prompts", default=",".join(p.key for p in PROMPTS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    chosen = [p for p in PROMPTS if p.key in args.prompts.split(",")]
    if args.rounds < 1 or not chosen:
        parser.error("--rounds must be at least 1 and --prompts must name a prompt")
    settings = LlamaLoadSettings(n_ctx=2048, n_threads=args.threads)
    with (
        LlamaEngine(args.main or model_path(DEFAULT_MAIN_KEY), settings) as main_model,
        LlamaEngine(args.draft or model_path(DEFAULT_DRAFT_KEY), settings, is_draft=True) as draft,
    ):
        cost_cache = CostCache()
        results = [
            run_prompt(main_model, draft, p, args.rounds, args.max_tokens, cost_cache)
            for p in chosen
        ]
    line = machine_line(args.threads)
    if args.json:
        print(
            json.dumps(
                {
                    "machine": line,
                    "rounds": args.rounds,
                    "prompts": [{**r.__dict__, "median": r.median} for r in results],
                },
                indent=1,
            )
        )
    else:
        print(format_table(results, line, args.rounds))
    return 0 if all(r.identical for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
