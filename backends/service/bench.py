"""`specdeck-bench`: plain vs speculative decoding on one loaded main model, one prompt or a suite.

One prompt: plain decoding, then the chosen method (``--method``, ``auto`` by default),
side by side. ``--suite``: the prompts of :mod:`backends.service.suite_prompts`, each run plain and
with every method, in one table (tok/s, speedup, acceptance, chosen draft lengths,
identical text) — the figures in the README come from it. ``--tune``: the fastest setup
for the main model on this machine (:mod:`backends.service.tune_bench`).

This module is the command line: it turns the flags into a
:class:`~backends.service.protocol.LoadRequest` and generation settings, opens the pair
with the pair service (:mod:`backends.service.loaded_pair`: file and memory checks, the
draft's MLX import, the crash records' settings, calibration), and prints what
:mod:`backends.service.bench_suite` and the service measured with
:mod:`backends.service.bench_report`. A native crash cannot take the command down: the
measuring runs in a worker process watched by :mod:`backends.service.bench_watch`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from backends.engines.interface import ChatMessage
from backends.engines.load_guard import checkpoint
from backends.errors import SettingsError, SpecDeckError
from backends.models.catalog import read_catalog_model
from backends.service.bench_report import (
    format_suite,
    format_table,
    load_report,
    result_json,
    suite_json,
)
from backends.service.bench_suite import DEFAULT_PROMPT, run_suite, suite_keys
from backends.service.bench_watch import (
    EXIT_INTERRUPTED,
    PROG,
    WORKER_ENV,
    report_stages,
    watch_workers,
)
from backends.service.generation_options import (
    add_generation_arguments,
    generation_options_from_args,
    generation_settings,
)
from backends.service.loaded_pair import (
    add_load_arguments,
    crash_safe_request,
    import_progress_bars,
    open_pair,
    pair_paths_from_args,
    request_from_args,
    worker_options,
)
from backends.service.suite_prompts import SUITE_PROMPTS
from backends.service.tuning import DEFAULT_BUDGET_SECONDS
from backends.speculation.methods import parse_method

if TYPE_CHECKING:
    from backends.service.protocol import LoadRequest

DEFAULT_BENCH_MAX_TOKENS = 128


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
    add_load_arguments(parser)
    parser.add_argument(
        "--fixed-draft",
        action="store_true",
        help="draft the maximum length every round instead of the cost-aware length",
    )
    parser.add_argument(
        "--suite",
        action="store_true",
        help="run the benchmark suite: every prompt, plain and with every method (each prompt "
        "its own length; --max-tokens caps it)",
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
    add_generation_arguments(parser, max_tokens=DEFAULT_BENCH_MAX_TOKENS)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and engine logs")
    return parser


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is not None:
        try:
            return Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise SettingsError(f"cannot read prompt file {args.prompt_file}: {error}") from error
    return args.prompt if args.prompt is not None else DEFAULT_PROMPT


def _crash_safe(request: LoadRequest, stage_file: Path) -> tuple[LoadRequest, list[str]]:
    """The request with the settings the crash records allow, and the note when they differ.

    Why this worker loads with other settings than asked for is said now, and in the report;
    the watcher learns the settings and then every load stage.
    """
    request, note = crash_safe_request(request)
    avoided = [note] if note is not None else []
    for line in avoided:
        print(f"{PROG}: {line}", file=sys.stderr)
    report_stages(stage_file, request.risky)
    return request, avoided


def main(argv: list[str] | None = None) -> int:
    """Entry point of specdeck-bench; returns the exit status."""
    arguments = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(arguments)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.ERROR, format="%(name)s: %(message)s"
    )
    stage_file = os.environ.get(WORKER_ENV)
    if stage_file is None:
        return watch_workers(arguments, args.rpc)
    return _work(args, Path(stage_file))


def _work(args: argparse.Namespace, stage_file: Path) -> int:
    """The bench itself (in the worker process)."""
    try:
        settings = generation_settings(generation_options_from_args(args))
        messages = [ChatMessage("user", _read_prompt(args))]
        if args.system:
            messages.insert(0, ChatMessage("system", args.system))
        method = parse_method(args.method)
        workers, _split = worker_options(args)
        if args.tune:
            if workers:
                raise SettingsError("--tune runs on this machine; drop --rpc")
            return _tune(args, stage_file)
        if args.suite and (args.prompt is not None or args.prompt_file is not None):
            raise SettingsError("--suite runs its own prompts; drop --prompt/--prompt-file")
        prompt_keys = suite_keys(args.suite_prompts) if args.suite else None
        imports = import_progress_bars(sys.stderr)
        main_path, draft_path = pair_paths_from_args(args, imports)
        request, avoided = _crash_safe(
            request_from_args(args, main_path, draft_path, method), stage_file
        )
        with open_pair(request, import_progress=imports) as pair:
            checkpoint("loaded", request.main_path)
            if args.suite:
                rows = run_suite(
                    pair,
                    settings,
                    prompt_keys=prompt_keys,
                    max_tokens=args.max_tokens,  # None: each prompt's own length
                    progress=None if args.json else sys.stderr,
                )
                report = load_report(pair, 0)
            else:
                result = pair.compare(
                    messages,
                    settings,
                    method=method,
                    adaptive=not args.fixed_draft,
                    warmup=not args.no_warmup,
                )
                report = load_report(pair, result.prompt_tokens)
                report["method"] = method
        report["notes"] = [*avoided, *report["notes"]]  # type: ignore[misc]
    except SpecDeckError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # noqa: BLE001 - a bug: one line unless --debug
        if args.debug:
            traceback.print_exc()
        print(f"{PROG}: internal error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    if args.suite:
        print(
            json.dumps(suite_json(rows, report), ensure_ascii=False)
            if args.json
            else format_suite(rows, report)
        )
    elif args.json:
        print(json.dumps(result_json(result, report), ensure_ascii=False))
    else:
        print(format_table(result, report, settings))
    return 0


def _tune(args: argparse.Namespace, stage_file: Path) -> int:
    """``--tune``: rank every setup for the main model (errors are raised to _work)."""
    from backends.service.tune_bench import print_tuning, run_tune

    if args.suite:
        raise SettingsError("--tune and --suite are two different runs; choose one")
    main_path, _no_draft = pair_paths_from_args(
        args, import_progress_bars(sys.stderr), with_draft=False
    )
    drafts = None if args.draft is None else [args.draft]
    # The main model alone, no calibration: the trials load their drafts and measure.
    request, _avoided = _crash_safe(request_from_args(args, main_path, None, "off"), stage_file)
    prompt = _read_prompt(args) if args.prompt or args.prompt_file else None
    with open_pair(request) as pair:
        checkpoint("loaded", request.main_path)
        tuning, verdicts, recalled = run_tune(
            pair,
            drafts,
            budget_seconds=args.budget,
            prompt=prompt,
            again=args.again,
            progress=None if args.json else sys.stderr,
        )
    name = read_catalog_model(main_path).display_name
    print_tuning(tuning, verdicts, recalled, name, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
