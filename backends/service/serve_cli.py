"""``specdeck serve``: the OpenAI-compatible API on a loaded pair, without the window.

    specdeck serve                                    # the default pair on 127.0.0.1:8765
    specdeck serve --main big.gguf --draft small.gguf --port 1234
    specdeck serve --host 0.0.0.0 --api-key "$KEY"   # other machines: only with a key
    specdeck serve --rpc 10.0.0.5:50052,10.0.0.6:50052  # the main model on two workers

The port opens at once; requests get 503 ("the models are still loading") until the pair
is loaded, then run one at a time (see :mod:`backends.service.api`). One line per
served request goes to stderr: tok/s, acceptance and the draft-token counts. Ctrl+C stops
after the running round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

from backends.errors import SpecDeckError
from backends.service.api.app import DEFAULT_HOST, DEFAULT_PORT, ApiServer, ServerSettings
from backends.service.api.jobs import ServedModel
from backends.service.api.worker import PairWorker
from backends.service.generation_options import (
    add_generation_arguments,
    generation_options_from_args,
    generation_settings,
)
from backends.service.loaded_pair import (
    LoadedPair,
    add_load_arguments,
    check_files,
    crash_safe_request,
    import_progress_bars,
    open_pair,
    pair_paths_from_args,
    request_from_args,
)
from backends.speculation.methods import parse_method
from backends.speculation.types import DEFAULT_MAX_TOKENS

if TYPE_CHECKING:
    from backends.service.api.jobs import ApiJob
    from backends.service.generation_options import GenerationOptions
    from backends.speculation.types import SpeculationStats

PROG = "specdeck serve"
API_KEY_ENV = "SPECDECK_API_KEY"
EXIT_BAD_SETTINGS = 2
EXIT_LOAD_FAILED = 1

log = logging.getLogger("backends.service.serve")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``specdeck serve``."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Serve the main model (with its draft) over an OpenAI-compatible HTTP API "
        "with speculative decoding. Without --main/--draft it serves the default pair.",
    )
    add_load_arguments(parser)
    parser.add_argument(
        "--no-draft", action="store_true", help="no draft model: the lookups and plain decoding"
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address (default: {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"(default: {DEFAULT_PORT})")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}); needed "
        "for any address but 127.0.0.1",
    )
    parser.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        help="allow browser pages from this origin (repeatable; '*' for any); default: none",
    )
    defaults = parser.add_argument_group("generation defaults (a request may override them)")
    add_generation_arguments(defaults, max_tokens=DEFAULT_MAX_TOKENS)
    parser.add_argument("--debug", action="store_true", help="log every request and the engine")
    return parser


def generation_defaults(args: argparse.Namespace) -> GenerationOptions:
    """The flags' generation options, under every request's own; SettingsError if impossible."""
    defaults = generation_options_from_args(args)
    generation_settings(defaults)  # an impossible flag is said before the port opens
    if args.max_tokens is None:  # not given: each request's default, within the context
        del defaults["max_tokens"]
    return defaults


def _report(job: ApiJob, stats: SpeculationStats) -> None:
    acceptance = stats.acceptance_rate
    print(
        f"{PROG}: {stats.generated_tokens} tokens at {stats.tokens_per_second:.1f} tok/s, "
        f"drafted {stats.total_draft_tokens_count}, accepted "
        f"{stats.accepted_draft_tokens_count}"
        + (f" ({acceptance:.0%})" if acceptance is not None else "")
        + f", {stats.stop_reason}",
        file=sys.stderr,
        flush=True,
    )


async def _serve(api: ApiServer, worker: PairWorker, settings: ServerSettings) -> int:
    from aiohttp import web

    runner = web.AppRunner(api.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        print(
            f"{PROG}: error: cannot listen on {settings.host}:{settings.port}: {error.strerror}",
            file=sys.stderr,
        )
        return EXIT_BAD_SETTINGS
    host, port = runner.addresses[0][:2]
    print(
        f"{PROG}: listening on http://{host}:{port}/v1 (loading the models)",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # Windows
            loop.add_signal_handler(signum, stop.set)
    failure: list[str] = []

    def load_failed(problem: str) -> None:
        failure.append(problem)
        loop.call_soon_threadsafe(stop.set)

    worker.on_load_failed = load_failed
    worker.start()
    try:
        await stop.wait()
    finally:
        if not failure:
            print(f"{PROG}: stopping", file=sys.stderr, flush=True)
        await runner.cleanup()
        await loop.run_in_executor(None, worker.stop)
    if failure:
        print(f"{PROG}: error: {failure[0]}", file=sys.stderr)
        return EXIT_LOAD_FAILED
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``specdeck serve``; returns the exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO if args.debug else logging.WARNING, format="%(name)s: %(message)s"
    )
    if not args.debug:
        logging.getLogger("backends.engines.llama.native").setLevel(logging.ERROR)
    try:
        method = parse_method(args.method)
        defaults = generation_defaults(args)
        settings = ServerSettings(
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            cors_origins=tuple(args.cors_origin),
        )
        imports = import_progress_bars(sys.stderr)
        main_path, draft_path = pair_paths_from_args(args, imports, with_draft=not args.no_draft)
        request = request_from_args(args, main_path, draft_path, method)
        # Missing, corrupt or mismatched files, and a load that crashed even with the
        # safest settings: said before the port opens.
        check_files(request)
        request, avoided_crash = crash_safe_request(request)
    except SpecDeckError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    if avoided_crash is not None:
        print(f"{PROG}: {avoided_crash}", file=sys.stderr, flush=True)

    def load() -> tuple[LoadedPair, ServedModel, ServedModel | None]:
        pair = open_pair(request, import_progress=imports)
        main_model = ServedModel.of_engine(request.main_path, pair.main)
        draft_model = (
            ServedModel.of_engine(request.draft_path, pair.draft)
            if pair.draft is not None and request.draft_path is not None
            else None
        )
        print(
            f"{PROG}: ready: {pair.main.load_report.placement}"
            + (f"; draft {pair.draft.load_report.placement}" if pair.draft else ""),
            file=sys.stderr,
            flush=True,
        )
        return pair, main_model, draft_model

    worker = PairWorker(load, method=method, max_queued=settings.max_queued, on_finished=_report)
    api = ApiServer(worker, settings, defaults)
    return asyncio.run(_serve(api, worker, settings))


if __name__ == "__main__":
    sys.exit(main())
