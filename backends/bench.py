"""`specdeck-bench`: one prompt, plain vs speculative decoding, on one loaded main model."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from backends.compat import check_compatibility
from backends.engine import ChatMessage
from backends.errors import SettingsError, SpecDeckError
from backends.gguf_info import read_model_info
from backends.sampling import SamplingSettings
from backends.speculative import (
    DEFAULT_DRAFT_MAX,
    DEFAULT_DRAFT_MIN,
    DEFAULT_P_MIN,
    DraftModelDrafter,
    GenerationResult,
    GenerationSettings,
    SpeculationStats,
    SpeculativeDecoder,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

PROG = "specdeck-bench"
DEFAULT_PROMPT = "Write a quicksort function in Python."
DEFAULT_BENCH_MAX_TOKENS = 128
WARMUP_TOKENS = 8  # pages the weights in, so the first timed run is not penalised


@dataclass(frozen=True)
class BenchResult:
    """Both runs of one comparison."""

    baseline: GenerationResult
    speculative: GenerationResult
    greedy: bool

    @property
    def speedup(self) -> float | None:
        """Speculative tok/s over plain tok/s."""
        base = self.baseline.stats.tokens_per_second
        return self.speculative.stats.tokens_per_second / base if base > 0 else None

    @property
    def identical(self) -> bool | None:
        """Whether the texts match (only meaningful at temperature 0, else None)."""
        if not self.greedy:
            return None
        return self.baseline.token_ids == self.speculative.token_ids


def build_parser() -> argparse.ArgumentParser:
    """The command line of specdeck-bench."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Run one prompt with plain decoding and with speculative decoding on the same "
            "loaded main model and compare speed, acceptance and text. Without --main/--draft "
            "it uses the default pair (Qwen2.5-Coder 1.5B + 0.5B), fetched on first use."
        ),
    )
    parser.add_argument("--main", type=Path, help="main (target) model, a GGUF file")
    parser.add_argument("--draft", type=Path, help="draft model, a GGUF file")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help=f"user message (default: {DEFAULT_PROMPT!r})")
    prompt.add_argument("--prompt-file", type=Path, help="read the user message from a file")
    parser.add_argument("--system", help="system prompt")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_BENCH_MAX_TOKENS)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    parser.add_argument("--min-p", type=float, default=0.0, help="0.0 = off")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--draft-max", type=int, default=DEFAULT_DRAFT_MAX)
    parser.add_argument("--draft-min", type=int, default=DEFAULT_DRAFT_MIN)
    parser.add_argument(
        "--p-min",
        type=float,
        default=DEFAULT_P_MIN,
        help="stop drafting when the draft's top probability falls below this",
    )
    parser.add_argument(
        "--verification",
        choices=("rejection", "sample-match"),
        default="rejection",
        help="at temperature > 0: rejection sampling (default) or sample-and-match",
    )
    parser.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    parser.add_argument("--threads", type=int, default=None, help="default: physical cores")
    parser.add_argument(
        "--gpu-layers", type=int, default=-1, help="main model layers on the GPU (-1 = all)"
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and engine logs")
    return parser


def _sampling_from(args: argparse.Namespace) -> SamplingSettings:
    return SamplingSettings(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
    )


def _generation_settings(args: argparse.Namespace) -> GenerationSettings:
    return GenerationSettings(
        max_tokens=args.max_tokens,
        sampling=_sampling_from(args),
        draft_max=args.draft_max,
        draft_min=args.draft_min,
        p_min=args.p_min,
        verification=args.verification,
    )


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is not None:
        try:
            return Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise SettingsError(f"cannot read prompt file {args.prompt_file}: {error}") from error
    return args.prompt if args.prompt is not None else DEFAULT_PROMPT


def _model_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    if args.main is not None and args.draft is not None:
        return args.main, args.draft
    from backends.provision import (
        DEFAULT_DRAFT_KEY,
        DEFAULT_MAIN_KEY,
        TextProgressBar,
        ensure_model,
    )

    progress = TextProgressBar(sys.stderr)
    try:
        main = args.main or ensure_model(DEFAULT_MAIN_KEY, progress)
        draft = args.draft or ensure_model(DEFAULT_DRAFT_KEY, progress)
    finally:
        progress.finish()
    return main, draft


def run_bench(
    main_path: Path,
    draft_path: Path,
    messages: Sequence[ChatMessage],
    settings: GenerationSettings,
    *,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    gpu_layers: int = -1,
    warmup: bool = True,
) -> tuple[BenchResult, dict[str, object]]:
    """Load the pair, run plain then speculative decoding, return both and a load report."""
    from backends.llama_engine import LlamaEngine, LlamaLoadSettings

    check_compatibility(read_model_info(main_path), read_model_info(draft_path))
    load = LlamaLoadSettings(n_ctx=n_ctx, n_threads=n_threads, gpu_layers=gpu_layers)
    with (
        LlamaEngine(main_path, load) as main,
        LlamaEngine(draft_path, load, is_draft=True) as draft,
    ):
        plain = SpeculativeDecoder(main)
        speculative = SpeculativeDecoder(main, DraftModelDrafter(draft, p_min=settings.p_min))
        prompt = plain.prompt_tokens(messages)
        if warmup:
            short = GenerationSettings(max_tokens=WARMUP_TOKENS, draft_max=settings.draft_max)
            speculative.run(prompt, short)
        # Each timed run starts from empty caches, so both pay for the prompt alike.
        main.truncate(0)
        draft.truncate(0)
        baseline = plain.run(prompt, settings)
        main.truncate(0)
        spec = speculative.run(prompt, settings)
        report: dict[str, object] = {
            "main": main.load_report.model_name,
            "draft": draft.load_report.model_name,
            "main_placement": main.load_report.placement,
            "draft_placement": draft.load_report.placement,
            "backend": main.load_report.backend,
            "exact_batch_limit": main.exact_batch_limit,
            "prompt_tokens": len(prompt),
        }
    return BenchResult(baseline, spec, settings.sampling.greedy), report


def _run_json(result: GenerationResult, speculative: bool) -> dict[str, object]:
    stats = result.stats
    data: dict[str, object] = {
        "text": result.text,
        "tokens": stats.generated_tokens,
        "tokens_per_second": stats.tokens_per_second,
        "time_to_first_token_sec": stats.time_to_first_token_sec,
        "stop_reason": stats.stop_reason,
    }
    if speculative:
        data.update(stats.as_dict())
        data["origins"] = "".join("d" if t.origin == "draft" else "t" for t in result.tokens)
    return data


def result_json(result: BenchResult, report: dict[str, object]) -> dict[str, object]:
    """The --json object."""
    return {
        "baseline": _run_json(result.baseline, speculative=False),
        "speculative": _run_json(result.speculative, speculative=True),
        "speedup": result.speedup,
        "identical": result.identical,
        "load": report,
    }


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def format_table(
    result: BenchResult, report: dict[str, object], settings: GenerationSettings
) -> str:
    """The human-readable comparison, like LM Studio's stats."""
    base, spec = result.baseline.stats, result.speculative.stats
    lines = [
        f"main:  {report['main']} — {report['main_placement']}",
        f"draft: {report['draft']} — {report['draft_placement']}",
        f"prompt {report['prompt_tokens']} tokens · max {settings.max_tokens} tokens · "
        f"temperature {settings.sampling.temperature:g} · draft max {settings.draft_max} · "
        f"p-min {settings.p_min:g}",
        "",
        f"{'':14}{'tokens':>8}{'tok/s':>9}{'TTFT':>9}  stop",
    ]
    for label, stats in (("plain", base), ("speculative", spec)):
        ttft = stats.time_to_first_token_sec or 0.0
        lines.append(
            f"{label:14}{stats.generated_tokens:>8}{stats.tokens_per_second:>9.1f}"
            f"{ttft:>8.2f}s  {stats.stop_reason}"
        )
    lines.append("")
    speedup = result.speedup
    if speedup is not None:
        verdict = "faster" if speedup >= 1.0 else "SLOWER than plain decoding"
        lines.append(
            f"speedup: {speedup:.2f}× ({base.tokens_per_second:.1f} → "
            f"{spec.tokens_per_second:.1f} tok/s, {verdict})"
        )
    lines.append(_draft_line(spec))
    positions = ", ".join(
        f"{i + 1}: {_percent(rate)}" for i, rate in enumerate(spec.acceptance_by_position)
    )
    lines.append(f"acceptance by draft position: {positions}")
    lines.append(
        f"time: drafting {spec.draft_seconds:.2f} s, verifying {spec.verify_seconds:.2f} s, "
        f"loop overhead {spec.overhead_seconds:.3f} s over {spec.rounds} rounds"
    )
    if result.identical is not None:
        lines.append(f"identical text: {'yes' if result.identical else 'NO'}")
    return "\n".join(lines)


def _draft_line(stats: SpeculationStats) -> str:
    return (
        f"draft tokens: {stats.total_draft_tokens_count} total, "
        f"{stats.accepted_draft_tokens_count} accepted, "
        f"{stats.rejected_draft_tokens_count} rejected, "
        f"{stats.ignored_draft_tokens_count} ignored — acceptance "
        f"{_percent(stats.acceptance_rate)}"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of specdeck-bench; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.ERROR, format="%(name)s: %(message)s"
    )
    try:
        settings = _generation_settings(args)
        if args.ctx < 1:
            raise SettingsError(f"--ctx must be >= 1, got {args.ctx}")
        messages = [ChatMessage("user", _read_prompt(args))]
        if args.system:
            messages.insert(0, ChatMessage("system", args.system))
        main_path, draft_path = _model_paths(args)
        result, report = run_bench(
            main_path,
            draft_path,
            messages,
            settings,
            n_ctx=args.ctx,
            n_threads=args.threads,
            gpu_layers=args.gpu_layers,
            warmup=not args.no_warmup,
        )
    except SpecDeckError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - a bug: one line unless --debug
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: internal error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result_json(result, report), ensure_ascii=False))
    else:
        print(format_table(result, report, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
