"""Is auto ever slower than plain decoding? Each prompt run again and again; the worst run counts.

Auto's promise is that speculation never makes an answer slower. A median hides the run
where it did, so this runs each prompt ``--runs`` times (default 5), each in a fresh
process (a new load, a new calibration: the run-to-run swings users see come from there),
and reports per prompt the worst, the median and the best of auto's speed over plain
decoding's, the share of drafted tokens accepted, and whether every text was plain
decoding's. The prompts are the peer benchmark's (:data:`benchmarks.vs_llama_cpp.PROMPTS`),
each with the answer length of its kind (new code and prose 128 tokens, the edits 320 and
160). Runs rotate through the prompts, so that machine noise hits every prompt alike.

A shared 2-core machine's speed drifts by 10-25 % within seconds, more than the gains to
be judged on a slow CPU. So each run answers four times on its one load, plain, auto, auto,
plain (each auto answer on a fresh decoder, as ``specdeck-bench`` does, sharing the load's
batch costs), and compares auto's two against plain's two: a drift that is steady over the
four cancels. How far plain's second answer was from its first ("plain against itself")
is printed beside, as the noise the figures stand in.

``SPECDECK_CPU_VARIANT=haswell`` (with a build that has CPU variants, the bundle's) runs
the AVX2 CPU library on an AVX-512 machine; ``SPECDECK_PASS_DELAY`` makes the passes slower
on purpose (:mod:`backends.engines.pass_delay`). Both reach every run.

    .venv/bin/python -m benchmarks.never_slower [--runs 5] [--prompts KEYS] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from backends.engines.hardware import CPU_VARIANT_ENV, physical_cores
from backends.engines.pass_delay import PASS_DELAY_ENV
from backends.engines.weight_placement import cpu_flags, cpu_model_name
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path
from benchmarks.vs_llama_cpp import PROMPTS, PeerPrompt

# Answer lengths by prompt: the lengths of the runs that found auto slower than plain.
MAX_TOKENS = {"new-function": 128, "prose": 128, "docstrings": 320, "refactor": 160}
GOAL_WORST = 0.97  # auto at least this fast as plain in every run
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


@dataclass
class MethodTime:
    """What one method's rounds gave in auto's answers, and what plain would have taken."""

    tokens: int = 0
    seconds: float = 0.0
    plain_seconds: float = 0.0  # the same tokens at plain decoding's pace of the same run

    def add(self, tokens: int, seconds: float, plain_seconds_per_token: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.plain_seconds += tokens * plain_seconds_per_token

    @property
    def pace(self) -> float:
        """Its tokens per second over plain's (above 1: it gained)."""
        return self.plain_seconds / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class PromptRuns:
    """One prompt's runs: auto over plain in each, and what was accepted."""

    key: str
    kind: str
    speedups: tuple[float, ...]
    acceptance: tuple[float, ...]
    plain_vs_plain: tuple[float, ...]  # plain's last answer over its first, in each run
    identical: bool
    # Per method, over every auto answer: tokens, seconds, and those seconds' plain worth
    # (the tokens at plain decoding's pace in the same run).
    time_by_method: dict[str, MethodTime] = field(default_factory=dict)
    answers: int = 0  # auto answers behind time_by_method

    @property
    def worst(self) -> float:
        """The slowest run's auto over plain."""
        return min(self.speedups)

    @property
    def median(self) -> float:
        """The median run's."""
        return statistics.median(self.speedups)


def run_once(prompt: PeerPrompt, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run on ``prompt`` in a fresh process: one load, plain, auto, auto, plain."""
    prompt_file = folder / f"{prompt.key}.txt"
    prompt_file.write_text(prompt.text, encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "benchmarks.never_slower",
        "--one",
        str(prompt_file),
        "--max-tokens",
        str(MAX_TOKENS.get(prompt.key, 160)),
        "--main",
        str(args.main),
        "--draft",
        str(args.draft),
        "--threads",
        str(args.threads),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the run failed on {prompt.key}: {done.stderr.strip()[-300:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def one_run(prompt_file: Path, max_tokens: int, args: argparse.Namespace) -> dict[str, Any]:
    """The child's run: load the pair as ``specdeck-bench`` does, answer P, A, A, P."""
    from backends.engines.interface import ChatMessage
    from backends.service.bench import build_parser
    from backends.service.generation_options import (
        generation_options_from_args,
        generation_settings,
    )
    from backends.service.loaded_pair import open_pair, request_from_args
    from backends.service.pair_runs import WARMUP_TOKENS, timed_run
    from backends.speculation.loop import SpeculativeDecoder
    from backends.speculation.methods import build_decoder

    bench_args = build_parser().parse_args(
        ["--main", str(args.main), "--draft", str(args.draft), "--threads", str(args.threads)]
        + ["--prompt-file", str(prompt_file), "--max-tokens", str(max_tokens)]
    )
    settings = generation_settings(generation_options_from_args(bench_args))
    request = request_from_args(bench_args, args.main, args.draft, "auto")
    messages = [ChatMessage("user", prompt_file.read_text(encoding="utf-8"))]
    with open_pair(request) as pair:
        engines = (pair.main, pair.draft)
        plain = SpeculativeDecoder(pair.main)

        def auto() -> SpeculativeDecoder:
            return build_decoder("auto", pair.main, pair.draft, cost_cache=pair.costs)

        prompt = plain.prompt_tokens(messages)
        timed_run(auto(), engines, prompt, replace(settings, max_tokens=WARMUP_TOKENS))
        plain_first = timed_run(plain, engines, prompt, settings)
        autos = [timed_run(auto(), engines, prompt, settings) for _ in range(2)]
        plain_last = timed_run(plain, engines, prompt, settings)
    plains = (plain_first, plain_last)
    plain_speed = statistics.mean(run.stats.tokens_per_second for run in plains)
    time_by_method: dict[str, dict[str, float]] = {}
    for run in autos:
        for method, tokens in run.stats.tokens_by_method.items():
            entry = time_by_method.setdefault(method, {"tokens": 0, "seconds": 0.0})
            entry["tokens"] += tokens
            entry["seconds"] += run.stats.seconds_by_method.get(method, 0.0)
    auto_speed = statistics.mean(run.stats.tokens_per_second for run in autos)
    drafted = sum(run.stats.total_draft_tokens_count for run in autos)
    accepted = sum(run.stats.accepted_draft_tokens_count for run in autos)
    return {
        "speedup": auto_speed / plain_speed,
        "plain_vs_plain": plain_last.stats.tokens_per_second / plain_first.stats.tokens_per_second,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "identical": all(run.token_ids == plain_first.token_ids for run in (*autos, plain_last)),
        "backoffs": [run.stats.backoffs for run in autos],
        "rounds_by_method": [run.stats.rounds_by_method for run in autos],
        "time_by_method": time_by_method,
        "plain_seconds_per_token": 1.0 / plain_speed,
        "answers": len(autos),
    }


def measure(args: argparse.Namespace, prompts: tuple[PeerPrompt, ...]) -> list[PromptRuns]:
    """Every prompt ``args.runs`` times, rotating through them."""
    speedups: dict[str, list[float]] = {p.key: [] for p in prompts}
    acceptance: dict[str, list[float]] = {p.key: [] for p in prompts}
    plain_vs_plain: dict[str, list[float]] = {p.key: [] for p in prompts}
    identical = dict.fromkeys(speedups, True)
    time_by_method: dict[str, dict[str, MethodTime]] = {p.key: {} for p in prompts}
    answers = dict.fromkeys(speedups, 0)
    with tempfile.TemporaryDirectory(prefix="specdeck-never-slower-") as folder:
        for run in range(args.runs):
            for prompt in prompts:
                print(f"run {run + 1}: {prompt.key}", file=sys.stderr, flush=True)
                report = run_once(prompt, Path(folder), args)
                speedups[prompt.key].append(float(report["speedup"]))
                acceptance[prompt.key].append(float(report["acceptance_rate"]))
                plain_vs_plain[prompt.key].append(float(report["plain_vs_plain"]))
                identical[prompt.key] = identical[prompt.key] and bool(report["identical"])
                answers[prompt.key] += int(report["answers"])
                for method, spent in report["time_by_method"].items():
                    entry = time_by_method[prompt.key].setdefault(method, MethodTime())
                    entry.add(
                        int(spent["tokens"]),
                        float(spent["seconds"]),
                        float(report["plain_seconds_per_token"]),
                    )
    return [
        PromptRuns(
            p.key,
            p.kind,
            tuple(speedups[p.key]),
            tuple(acceptance[p.key]),
            tuple(plain_vs_plain[p.key]),
            identical[p.key],
            time_by_method[p.key],
            answers[p.key],
        )
        for p in prompts
    ]


def machine_line(threads: int) -> str:
    """The CPU, its vector extensions, the CPU library asked for and any injected delay."""
    flags = cpu_flags()
    vectors = " ".join(flag for flag in VECTOR_FLAGS if flag in flags) or "no AVX2"
    line = f"{cpu_model_name()} ({vectors}), {threads} threads"
    if os.environ.get(CPU_VARIANT_ENV):
        line += f", CPU library {os.environ[CPU_VARIANT_ENV]}"
    if os.environ.get(PASS_DELAY_ENV):
        line += f", {PASS_DELAY_ENV}={os.environ[PASS_DELAY_ENV]}"
    return line


def format_table(results: list[PromptRuns], args: argparse.Namespace) -> str:
    """The Markdown table: worst, median and best run per prompt."""
    lines = [
        f"{machine_line(args.threads)}; {args.runs} runs a prompt, each plain, auto, auto, plain "
        "on one load",
        "| prompt | worst | median | best | every run | accepted (median) "
        "| plain against itself (farthest) | identical |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        runs = " ".join(f"{value:.2f}" for value in result.speedups)
        mark = "" if result.worst >= GOAL_WORST else " (below 0.97)"
        lines.append(
            f"| {result.key} ({result.kind}) | {result.worst:.2f}×{mark} | "
            f"{result.median:.2f}× | {max(result.speedups):.2f}× | {runs} | "
            f"{statistics.median(result.acceptance):.0%} | "
            f"{max(result.plain_vs_plain, key=lambda r: abs(r - 1.0)):.2f}× | "
            f"{'yes' if result.identical else 'NO'} |"
        )
    return "\n".join(lines)


def format_time_table(results: list[PromptRuns]) -> str:
    """Where auto's time went: per prompt and method, its pace and what it won or lost."""
    lines = [
        "Where auto's time went (every auto answer; the prompt's round left out): each "
        "method's share of the tokens, its pace over plain decoding's in the same run, and "
        "the seconds it won (+) or lost (-) per answer against plain's pace",
        "| prompt | method | tokens | pace over plain | seconds per answer |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        total = sum(entry.tokens for entry in result.time_by_method.values()) or 1
        answers = max(1, result.answers)
        for method, entry in sorted(
            result.time_by_method.items(), key=lambda item: -item[1].tokens
        ):
            won = (entry.plain_seconds - entry.seconds) / answers
            lines.append(
                f"| {result.key} | {method} | {entry.tokens / total:.0%} | "
                f"{entry.pace:.2f}× | {won:+.2f} s |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table (or JSON)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.never_slower")
    parser.add_argument("--main", type=Path, default=None, help="default: the default main")
    parser.add_argument("--draft", type=Path, default=None, help="default: the default draft")
    parser.add_argument(
        "--prompts",
        default="new-function,prose,docstrings",
        help="comma-separated prompt keys (" + ", ".join(p.key for p in PROMPTS) + ")",
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a run's child process
    parser.add_argument("--max-tokens", type=int, default=128, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    wanted = [key.strip() for key in args.prompts.split(",") if key.strip()]
    unknown = sorted(set(wanted) - {p.key for p in PROMPTS})
    if unknown:
        parser.error(f"unknown prompt {', '.join(unknown)}")
    args.main = args.main or model_path(DEFAULT_MAIN_KEY)
    args.draft = args.draft or model_path(DEFAULT_DRAFT_KEY)
    if args.one is not None:
        print(json.dumps(one_run(args.one, args.max_tokens, args)))
        return 0
    results = measure(args, tuple(p for p in PROMPTS if p.key in wanted))
    if args.json:
        print(
            json.dumps(
                {
                    "machine": machine_line(args.threads),
                    "runs": args.runs,
                    "prompts": [
                        {
                            **asdict(r),
                            "worst": r.worst,
                            "median": r.median,
                            "pace_by_method": {
                                method: entry.pace for method, entry in r.time_by_method.items()
                            },
                        }
                        for r in results
                    ],
                },
                indent=2,
            )
        )
    else:
        print(format_table(results, args))
        print()
        print(format_time_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
