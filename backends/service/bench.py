"""`specdeck-bench`: plain vs speculative decoding on one loaded main model, one prompt or a suite.

One prompt: plain decoding, then the chosen method (``--method``, ``auto`` by default),
side by side. ``--suite``: the prompts of :mod:`backends.service.suite_prompts`, each run plain and
with every method, in one table (tok/s, speedup, acceptance, chosen draft lengths,
identical text) — the figures in the README come from it.

A native crash cannot take the command down: the measuring runs in a worker process (this
module again, with ``$SPECDECK_BENCH_WORKER`` naming a file where it writes how far its
load got). When the worker dies while loading, the crash is recorded for that model and
CPU (backends.engines.load_guard), one line says what happened, and the worker runs once more,
when it loads with the safest settings; a second crash ends the command with exit code 3.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from backends.engines.draft_weights import DRAFT_WEIGHT_MODES
from backends.engines.interface import DEFAULT_CONTEXT_SIZE, ChatMessage
from backends.engines.load_guard import (
    SAFEST,
    SAFEST_DESCRIPTION,
    CrashRecords,
    RiskySettings,
    add_stage_listener,
    avoided_crash_note,
    checkpoint,
    crash_message,
    signal_name,
)
from backends.engines.rpc import parse_workers, probe_worker
from backends.engines.weight_placement import WEIGHT_REPACKING_MODES
from backends.errors import SettingsError, SpecDeckError
from backends.models.catalog import read_catalog_model
from backends.models.compat import check_compatibility
from backends.service.protocol import ENGINE_KINDS
from backends.service.suite_prompts import SUITE_PROMPTS
from backends.service.tuning import DEFAULT_BUDGET_SECONDS
from backends.service.worker_cli import add_worker_options, worker_options
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import (
    DEFAULT_METHOD,
    METHODS,
    SpeculationMethod,
    build_decoder,
    parse_method,
)
from backends.speculation.planner import CostCache
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import (
    DEFAULT_DRAFT_MAX,
    DEFAULT_DRAFT_MIN,
    DEFAULT_LOOKUP_DRAFT_MAX,
    DEFAULT_P_MIN,
    GenerationResult,
    GenerationSettings,
    SpeculationStats,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from backends.engines.draft_weights import DraftWeights
    from backends.engines.interface import ModelEngine
    from backends.service.protocol import EngineKind

PROG = "specdeck-bench"
DEFAULT_PROMPT = "Write a quicksort function in Python."
DEFAULT_BENCH_MAX_TOKENS = 128
WARMUP_TOKENS = 8  # pages the weights in, so the first timed run is not penalised
WORKER_ENV = "SPECDECK_BENCH_WORKER"  # in the worker: the file its load stages go to
EXIT_ENGINE_CRASHED = 3
DEFAULT_LOAD = RiskySettings()


@dataclass(frozen=True)
class BenchResult:
    """Both runs of one comparison."""

    baseline: GenerationResult
    speculative: GenerationResult
    greedy: bool

    @property
    def speedup(self) -> float | None:
        """Speculative tok/s over plain tok/s."""
        return self.speculative.stats.speedup_over(self.baseline.stats)

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
    parser.add_argument(
        "--main",
        type=Path,
        help="main (target) model: a GGUF file, or with --engine mlx also an MLX folder",
    )
    parser.add_argument("--draft", type=Path, help="draft model (same kind as --main)")
    parser.add_argument(
        "--engine",
        choices=ENGINE_KINDS,
        default="llama.cpp",
        help="inference engine (default: llama.cpp); mlx runs MLX model folders and imports "
        "a GGUF file (given, or the default pair) into one on first use",
    )
    parser.add_argument(
        "--method",
        default=DEFAULT_METHOD,
        help=f"speculation method: {', '.join(METHODS)} (default: {DEFAULT_METHOD})",
    )
    parser.add_argument(
        "--fixed-draft",
        action="store_true",
        help="draft the maximum length every round instead of the cost-aware length",
    )
    parser.add_argument(
        "--fast-batches",
        action="store_true",
        help="verify each draft in one batch (llama.cpp's way) instead of bit-exact chunks; "
        "faster where big batches are cheap, but a near-tie may resolve differently",
    )
    parser.add_argument(
        "--sibling-branches",
        action="store_true",
        help="verify the draft model's second choice as a sibling branch where the costs say "
        "it pays (temperature 0; off by default, it gained nothing where measured)",
    )
    parser.add_argument(
        "--suite",
        action="store_true",
        help="run the benchmark suite: every prompt, plain and with every method",
    )
    parser.add_argument(
        "--suite-prompts",
        help="with --suite: only these prompts (comma-separated keys: "
        + ", ".join(p.key for p in SUITE_PROMPTS)
        + ")",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="find the fastest setup for --main on this machine: plain, every n-gram method, "
        "auto and every compatible local draft (or only --draft), ranked and explained; "
        "remembered per model and machine",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_SECONDS,
        help=f"with --tune: the time budget in seconds (default: {DEFAULT_BUDGET_SECONDS:.0f})",
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="with --tune: measure even when a result for this model and machine is remembered",
    )
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
        "--lookup-draft-max",
        type=int,
        default=DEFAULT_LOOKUP_DRAFT_MAX,
        help="longest draft of the n-gram lookups",
    )
    parser.add_argument(
        "--p-min",
        type=float,
        default=DEFAULT_P_MIN,
        help="stop drafting when the draft's top probability falls below this (with "
        "--fixed-draft; the cost-aware planner learns where to stop)",
    )
    parser.add_argument(
        "--verification",
        choices=("rejection", "sample-match"),
        default="rejection",
        help="at temperature > 0: rejection sampling (default) or sample-and-match",
    )
    parser.add_argument(
        "--ctx", type=int, default=DEFAULT_CONTEXT_SIZE, help="context size in tokens"
    )
    parser.add_argument("--threads", type=int, default=None, help="default: physical cores")
    parser.add_argument(
        "--gpu-layers", type=int, default=-1, help="main model layers on the GPU (-1 = all)"
    )
    parser.add_argument(
        "--weight-repacking",
        choices=WEIGHT_REPACKING_MODES,
        default="auto",
        help="llama.cpp's repacked CPU weight layouts (never AMX); auto = on",
    )
    parser.add_argument(
        "--draft-weights",
        choices=DRAFT_WEIGHT_MODES,
        default="auto",
        help="the draft's weights: auto = a Q4_0 copy (made once) where that is lighter and "
        "the draft runs on the CPU; stored = the file as it is; q4_0 = always the copy",
    )
    add_worker_options(parser)
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
        lookup_draft_max=args.lookup_draft_max,
        exact_batches=not args.fast_batches,
        sibling_branches=args.sibling_branches,
    )


def _suite_keys(text: str | None) -> list[str] | None:
    if text is None:
        return None
    keys = [key.strip() for key in text.split(",") if key.strip()]
    known = {prompt.key for prompt in SUITE_PROMPTS}
    unknown = [key for key in keys if key not in known]
    if unknown or not keys:
        raise SettingsError(
            f"unknown suite prompt {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(sorted(known))}"
        )
    return keys


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is not None:
        try:
            return Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise SettingsError(f"cannot read prompt file {args.prompt_file}: {error}") from error
    return args.prompt if args.prompt is not None else DEFAULT_PROMPT


def _model_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    main, draft = args.main, args.draft
    if main is None or draft is None:
        from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, ensure_model
        from backends.service.models_cli import TextProgressBar

        progress = TextProgressBar(sys.stderr)
        try:
            main = main or ensure_model(DEFAULT_MAIN_KEY, progress)
            draft = draft or ensure_model(DEFAULT_DRAFT_KEY, progress)
        finally:
            progress.finish()
    if args.engine == "mlx":
        main, draft = (_mlx_folder(path) for path in (main, draft))
    return main, draft


def _mlx_folder(path: Path) -> Path:
    """A GGUF file's MLX import, made on first use (with a progress bar); anything else as is."""
    if not (path.is_file() and path.suffix.lower() == ".gguf"):
        return path  # an MLX folder, or a path the engine will name as missing or broken
    from backends.models.gguf_to_mlx import ImportProgressBar, ensure_mlx_import

    return ensure_mlx_import(path, ImportProgressBar(sys.stderr, path.stem))


@dataclass(frozen=True)
class PairOptions:
    """How the bench loads its pair: engine, context, crash-prone settings, workers, draft."""

    n_ctx: int = DEFAULT_CONTEXT_SIZE
    engine: EngineKind = "llama.cpp"
    load_settings: RiskySettings = DEFAULT_LOAD
    # llama.cpp RPC workers holding part of the main model, split by layer_split.
    workers: tuple[str, ...] = ()
    layer_split: tuple[float, ...] = ()
    draft_weights: DraftWeights = "auto"


@contextmanager
def loaded_pair(
    main_path: Path, draft_path: Path | None, options: PairOptions = PairOptions()
) -> Iterator[tuple[ModelEngine, ModelEngine | None]]:
    """Check the pair, load both models (the draft fully offloaded), close them after."""
    from backends.engines.selection import open_engine

    if draft_path is not None:
        check_compatibility(read_catalog_model(main_path), read_catalog_model(draft_path))

    main = open_engine(
        options.engine,
        main_path,
        n_ctx=options.n_ctx,
        settings=options.load_settings,
        workers=options.workers,
        layer_split=options.layer_split,
    )
    try:
        if draft_path is None:
            checkpoint("loaded", main_path)
            yield main, None
            return
        draft = open_engine(
            options.engine,
            draft_path,
            n_ctx=options.n_ctx,
            settings=options.load_settings,
            is_draft=True,
            draft_weights=options.draft_weights,
        )
        checkpoint("loaded", main_path)
        try:
            yield main, draft
        finally:
            draft.close()
    finally:
        main.close()


def timed_run(
    decoder: SpeculativeDecoder,
    engines: Sequence[ModelEngine | None],
    prompt: Sequence[int],
    settings: GenerationSettings,
) -> GenerationResult:
    """One timed generation from empty caches, so every run pays for the prompt alike."""
    for engine in engines:
        if engine is not None:
            engine.truncate(0)
    return decoder.run(prompt, settings)


def _load_report(main: ModelEngine, draft: ModelEngine | None, prompt: int) -> dict[str, object]:
    return {
        "main": main.load_report.model_name,
        "draft": draft.load_report.model_name if draft is not None else None,
        "main_placement": main.load_report.placement,
        "draft_placement": draft.load_report.placement if draft is not None else None,
        "backend": main.load_report.backend,
        "exact_batch_limit": main.exact_batch_limit,
        "prompt_tokens": prompt,
        # What was chosen for the weights and why ("weight repacking on (auto), AMX ..."),
        # then what only the draft says ("draft requantized to Q4_0 for speed ...").
        "notes": list(main.load_report.notes)
        + [
            note
            for note in (draft.load_report.notes if draft is not None else ())
            if note not in main.load_report.notes
        ],
        "main_weight_buffers": list(main.load_report.weight_buffers),
        "workers": [status.summary() for status in main.worker_statuses()],
    }


def run_bench(
    main_path: Path,
    draft_path: Path | None,
    messages: Sequence[ChatMessage],
    settings: GenerationSettings,
    *,
    method: SpeculationMethod = DEFAULT_METHOD,
    adaptive: bool = True,
    warmup: bool = True,
    options: PairOptions = PairOptions(),
) -> tuple[BenchResult, dict[str, object]]:
    """Load the pair, run plain then speculative decoding, return both and a load report."""
    with loaded_pair(main_path, draft_path, options) as (main, draft):
        plain = SpeculativeDecoder(main)
        speculative = build_decoder(method, main, draft, adaptive=adaptive, p_min=settings.p_min)
        prompt = plain.prompt_tokens(messages)
        if warmup:
            short = replace(settings, max_tokens=WARMUP_TOKENS)
            timed_run(speculative, (main, draft), prompt, short)
        baseline = timed_run(plain, (main, draft), prompt, settings)
        spec = timed_run(speculative, (main, draft), prompt, settings)
        report = _load_report(main, draft, len(prompt))
        report["method"] = method
    return BenchResult(baseline, spec, settings.sampling.greedy), report


@dataclass(frozen=True)
class SuiteRow:
    """One prompt run with one method, next to the same prompt's plain run."""

    prompt: str
    method: str
    result: GenerationResult
    baseline: GenerationResult

    @property
    def speedup(self) -> float | None:
        """Tok/s of this run over plain decoding's on the same prompt."""
        return self.result.stats.speedup_over(self.baseline.stats)

    @property
    def identical(self) -> bool:
        """Whether the text equals plain decoding's (the suite runs at temperature 0)."""
        return self.result.token_ids == self.baseline.token_ids


# (label, method, adaptive, bit-exact batches); "plain" first: the others are compared to it
SUITE_METHODS: tuple[tuple[str, SpeculationMethod, bool, bool], ...] = (
    ("plain", "off", False, True),
    ("draft model, k=3", "draft-model", False, True),
    ("draft model, k=3, fast", "draft-model", False, False),
    ("ngram-simple", "ngram-simple", True, True),
    ("ngram-simple, fast", "ngram-simple", True, False),
    ("ngram-mod", "ngram-mod", True, True),
    ("ngram-mod, fast", "ngram-mod", True, False),
    ("edit-copy", "edit-copy", True, True),
    ("auto", "auto", True, True),
    ("auto, fast", "auto", True, False),
)


def run_suite(
    main_path: Path,
    draft_path: Path,
    settings: GenerationSettings,
    *,
    prompt_keys: Sequence[str] | None = None,
    progress: TextIO | None = None,
    options: PairOptions = PairOptions(),
) -> tuple[list[SuiteRow], dict[str, object]]:
    """Every suite prompt, plain and with every method, at temperature 0, in one process.

    Methods keep their decoders (and so what their planners learned) across prompts, as
    in the app; each run starts from empty caches. ``settings`` gives the shared knobs
    (draft max, p-min, lookup draft max); max tokens come from each prompt.
    """
    greedy = replace(settings, sampling=replace(settings.sampling, temperature=0.0))
    rows: list[SuiteRow] = []
    with loaded_pair(main_path, draft_path, options) as (main, draft):
        costs = CostCache()
        decoders = {
            label: build_decoder(
                method, main, draft, adaptive=adaptive, p_min=settings.p_min, cost_cache=costs
            )
            for label, method, adaptive, _exact in SUITE_METHODS
        }
        # Warm-up: pages the weights in and lets adaptive decoders calibrate, untimed.
        warm_prompt = decoders["plain"].prompt_tokens([ChatMessage("user", DEFAULT_PROMPT)])
        for decoder in decoders.values():
            timed_run(
                decoder, (main, draft), warm_prompt, replace(greedy, max_tokens=WARMUP_TOKENS)
            )
        report = _load_report(main, draft, 0)
        for prompt in SUITE_PROMPTS:
            if prompt_keys is not None and prompt.key not in prompt_keys:
                continue
            tokens = decoders["plain"].prompt_tokens([ChatMessage("user", prompt.text)])
            baseline: GenerationResult | None = None
            for label, _method, _adaptive, exact in SUITE_METHODS:
                run_settings = replace(greedy, max_tokens=prompt.max_tokens, exact_batches=exact)
                result = timed_run(decoders[label], (main, draft), tokens, run_settings)
                baseline = baseline or result
                rows.append(SuiteRow(prompt.key, label, result, baseline))
                if progress is not None:
                    print(f"  {prompt.key}: {label} done", file=progress, flush=True)
    return rows, report


def _length_summary(stats: SpeculationStats) -> str:
    """Chosen draft lengths: how many rounds drafted nothing, and the mean of the others."""
    counts = stats.draft_length_counts
    drafted = {k: v for k, v in counts.items() if k > 0}
    rounds = sum(counts.values())
    if not drafted:
        return "0 ×" + str(rounds)
    mean = sum(k * v for k, v in drafted.items()) / sum(drafted.values())
    plain = counts.get(0, 0)
    return f"{100 * plain / rounds:.0f}% 0, else {mean:.1f} (max {max(drafted)})"


def format_suite(rows: Sequence[SuiteRow], report: dict[str, object]) -> str:
    """The suite's one table."""
    lines = [
        f"main:  {report['main']} — {report['main_placement']}",
        f"draft: {report['draft']} — {report['draft_placement']}",
        *(f"worker {line}" for line in report.get("workers", ())),  # type: ignore[attr-defined]
        *(f"note:  {note}" for note in report["notes"]),  # type: ignore[attr-defined]
        "loop ms: time per round outside the engines' forward passes (Python, lookups, sampling)",
        f"bit-exact batch limit of the main model: {report['exact_batch_limit']} tokens; "
        "temperature 0",
        "",
        f"{'prompt':11}{'method':24}{'tok/s':>7}{'speedup':>9}{'accepted':>10}"
        f"{'identical':>11}{'loop ms':>9}  draft lengths (share of rounds at 0, mean of the rest)",
    ]
    for row in rows:
        stats = row.result.stats
        speedup = "–" if row.speedup is None else f"{row.speedup:.2f}×"
        identical = "yes" if row.identical else "NO"
        lengths = "–" if row.method == "plain" else _length_summary(stats)
        overhead = 1000 * stats.overhead_seconds / max(1, stats.rounds)
        lines.append(
            f"{row.prompt:11}{row.method:24}{stats.tokens_per_second:>7.1f}{speedup:>9}"
            f"{_percent(stats.acceptance_rate):>10}{identical:>11}{overhead:>9.2f}  {lengths}"
        )
    return "\n".join(lines)


def suite_json(rows: Sequence[SuiteRow], report: dict[str, object]) -> dict[str, object]:
    """The --suite --json object."""
    return {
        "load": report,
        "runs": [
            {
                "prompt": row.prompt,
                "method": row.method,
                "speedup": row.speedup,
                "identical": row.identical,
                "text": row.result.text,
                **row.result.stats.as_dict(),
            }
            for row in rows
        ],
    }


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
        *(f"worker {line}" for line in report.get("workers", ())),  # type: ignore[attr-defined]
        *(f"note:  {note}" for note in report["notes"]),  # type: ignore[attr-defined]
        f"method {report['method']} · prompt {report['prompt_tokens']} tokens · "
        f"max {settings.max_tokens} tokens · "
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
        + (
            f" (of them {stats.sibling_tokens_count} second choices as siblings, "
            f"{stats.accepted_sibling_tokens_count} taken)"
            if stats.sibling_tokens_count
            else ""
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of specdeck-bench; returns the exit status."""
    arguments = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(arguments)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.ERROR, format="%(name)s: %(message)s"
    )
    stage_file = os.environ.get(WORKER_ENV)
    if stage_file is None:
        return _watch_workers(arguments)
    return _work(args, Path(stage_file))


def _watch_workers(arguments: list[str]) -> int:
    """Run the bench in a worker; after a crash while loading, once more (safest settings)."""
    with tempfile.TemporaryDirectory(prefix="specdeck-bench-") as folder:
        stage_file = Path(folder) / "stages.jsonl"
        for attempt in (1, 2):
            stage_file.write_text("", encoding="utf-8")
            worker = subprocess.Popen(
                [sys.executable, "-m", "backends.service.bench", *arguments],
                env={**os.environ, WORKER_ENV: str(stage_file)},
            )
            try:
                status = worker.wait()
            except KeyboardInterrupt:
                worker.wait()  # it got the interrupt too, and says so itself
                return 130
            if status >= 0:
                return status
            cause = signal_name(-status)
            lost = _lost_workers(arguments)
            if lost:
                print(
                    f"{PROG}: error: the engine stopped ({cause}): {'; '.join(lost)}",
                    file=sys.stderr,
                )
                return EXIT_ENGINE_CRASHED
            settings, stage, model = _worker_progress(stage_file)
            if stage in ("", "loaded") or settings is None:
                print(f"{PROG}: error: the engine crashed ({cause}) after loading", file=sys.stderr)
                return EXIT_ENGINE_CRASHED
            CrashRecords().record(model, settings, stage, cause)
            line = crash_message(model, stage, settings, cause)
            if settings == SAFEST or attempt == 2:
                print(f"{PROG}: error: {line}; nothing safer is left to try", file=sys.stderr)
                return EXIT_ENGINE_CRASHED
            print(
                f"{PROG}: {line}; retrying once with the safest settings ({SAFEST_DESCRIPTION})",
                file=sys.stderr,
                flush=True,
            )
    return EXIT_ENGINE_CRASHED


def _lost_workers(arguments: list[str]) -> list[str]:
    """After the bench process died: the --rpc workers that no longer answer, one line each.

    llama.cpp aborts when a worker goes away; that is no load crash to remember.
    """
    try:
        workers = parse_workers(build_parser().parse_args(arguments).rpc)
    except (SettingsError, SystemExit):
        return []
    statuses = [probe_worker(worker) for worker in workers]
    return [
        f"worker {s.address} stopped answering ({s.problem})" for s in statuses if not s.reachable
    ]


def _worker_progress(stage_file: Path) -> tuple[RiskySettings | None, str, str]:
    """What a dead worker wrote: the settings it loaded with, its last stage and model."""
    settings: RiskySettings | None = None
    stage = model = ""
    for line in stage_file.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if "settings" in entry:
            settings = RiskySettings(**entry["settings"])
        else:
            stage, model = entry["stage"], entry["model"]
    return settings, stage, model


def _report_stages(stage_file: Path, settings: RiskySettings) -> None:
    """Write the load settings, then every load stage, to the file the watcher reads."""

    def write(entry: dict[str, object]) -> None:
        with stage_file.open("a", encoding="utf-8") as stream:
            stream.write(json.dumps(entry) + "\n")

    write({"settings": asdict(settings)})
    add_stage_listener(lambda stage, model: write({"stage": stage, "model": model}))


def _work(args: argparse.Namespace, stage_file: Path) -> int:
    """The bench itself (in the worker process)."""
    try:
        settings = _generation_settings(args)
        if args.ctx < 1:
            raise SettingsError(f"--ctx must be >= 1, got {args.ctx}")
        messages = [ChatMessage("user", _read_prompt(args))]
        if args.system:
            messages.insert(0, ChatMessage("system", args.system))
        method = parse_method(args.method)
        workers, layer_split = worker_options(args)
        if args.tune:
            if workers:
                raise SettingsError("--tune runs on this machine; drop --rpc")
            return _tune(args, stage_file)
        main_path, draft_path = _model_paths(args)
        requested = RiskySettings(args.weight_repacking, args.gpu_layers, args.threads)
        risky, crash = CrashRecords().choose((main_path, draft_path), requested)
        # Why this worker loads with other settings than asked for: said now, and in the report.
        avoided = [avoided_crash_note(crash)] if crash is not None else []
        for note in avoided:
            print(f"{PROG}: {note}", file=sys.stderr)
        _report_stages(stage_file, risky)
        options = PairOptions(
            n_ctx=args.ctx,
            engine=args.engine,
            load_settings=risky,
            workers=workers,
            layer_split=layer_split,
            draft_weights=args.draft_weights,
        )
        if args.suite:
            if args.prompt is not None or args.prompt_file is not None:
                raise SettingsError("--suite runs its own prompts; drop --prompt/--prompt-file")
            rows, suite_report = run_suite(
                main_path,
                draft_path,
                settings,
                prompt_keys=_suite_keys(args.suite_prompts),
                progress=None if args.json else sys.stderr,
                options=options,
            )
            suite_report["notes"] = [*avoided, *suite_report["notes"]]  # type: ignore[misc]
            if args.json:
                print(json.dumps(suite_json(rows, suite_report), ensure_ascii=False))
            else:
                print(format_suite(rows, suite_report))
            return 0
        result, report = run_bench(
            main_path,
            draft_path,
            messages,
            settings,
            method=method,
            adaptive=not args.fixed_draft,
            warmup=not args.no_warmup,
            options=options,
        )
        report["notes"] = [*avoided, *report["notes"]]  # type: ignore[misc]
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


def _tune(args: argparse.Namespace, stage_file: Path) -> int:
    """``--tune``: rank every setup for the main model (errors are raised to _work)."""
    from backends.service.tune_bench import print_tuning, run_tune

    if args.suite:
        raise SettingsError("--tune and --suite are two different runs; choose one")
    main_path = args.main
    if main_path is None:
        from backends.models.provision import DEFAULT_MAIN_KEY, ensure_model
        from backends.service.models_cli import TextProgressBar

        progress = TextProgressBar(sys.stderr)
        try:
            main_path = ensure_model(DEFAULT_MAIN_KEY, progress)
        finally:
            progress.finish()
    if args.engine == "mlx":
        main_path = _mlx_folder(main_path)
    drafts = None if args.draft is None else [args.draft]
    requested = RiskySettings(args.weight_repacking, args.gpu_layers, args.threads)
    risky, crash = CrashRecords().choose((main_path,), requested)
    if crash is not None:
        print(f"{PROG}: {avoided_crash_note(crash)}", file=sys.stderr)
    _report_stages(stage_file, risky)
    prompt = _read_prompt(args) if args.prompt or args.prompt_file else None
    tuning, verdicts, recalled = run_tune(
        main_path,
        drafts,
        budget_seconds=args.budget,
        prompt=prompt,
        again=args.again,
        n_ctx=args.ctx,
        engine=args.engine,
        load_settings=risky,
        progress=None if args.json else sys.stderr,
        draft_weights=args.draft_weights,
    )
    name = read_catalog_model(main_path).display_name
    print_tuning(tuning, verdicts, recalled, name, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
