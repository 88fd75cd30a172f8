"""``specdeck-models``: list, fetch, locate and import SpecDeck's models from a terminal.

The models themselves (registry, download, verification, locking) are
:mod:`backends.models.provision`, with the text progress bar that specdeck-bench and
specdeck serve share; this is its command line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from backends.engines.interface import DEFAULT_CONTEXT_SIZE
from backends.errors import ProvisioningError, SpecDeckError
from backends.models.provision import (
    DEFAULT_DRAFT_KEY,
    DEFAULT_MAIN_KEY,
    MODELS,
    ModelState,
    TextProgressBar,
    ensure_model,
    human_size,
    model_path,
    model_source,
    model_state,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

PROG = "specdeck-models"
logger = logging.getLogger(__name__)


class _UsageError(SpecDeckError):
    """The command line is wrong."""


class _ArgumentParser(argparse.ArgumentParser):
    """An argparse parser that reports a usage error as an exception, so main() can return 1."""

    def error(self, message: str) -> NoReturn:
        """Raise instead of printing usage and exiting with status 2."""
        raise _UsageError(f"{message} (see {PROG} --help)")


def _build_parser() -> argparse.ArgumentParser:
    common = _ArgumentParser(add_help=False)
    common.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help="the model folder (default: $SPECDECK_MODELS_DIR or SpecDeck's data folder)",
    )
    common.add_argument("-v", "--verbose", action="store_true", help="log what is being done")

    parser = _ArgumentParser(
        prog=PROG,
        description="Fetch, verify and locate the models SpecDeck uses.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fetch = commands.add_parser(
        "fetch",
        parents=[common],
        help="download and verify models (default: the default pair)",
        description="Download, assemble and verify models. Without arguments: the default pair.",
    )
    fetch.add_argument("keys", nargs="*", metavar="KEY", help="models to fetch (see 'list')")
    fetch.add_argument("--all", action="store_true", help="fetch every known model")
    fetch.add_argument(
        "--default-pair", action="store_true", help="fetch the default main and draft models"
    )
    commands.add_parser(
        "list", parents=[common], help="show every known model and whether it is here"
    )
    path = commands.add_parser(
        "path", parents=[common], help="print a verified model's path (exit 1 if it is not here)"
    )
    path.add_argument("key", metavar="KEY")
    import_mlx = commands.add_parser(
        "import-mlx",
        parents=[common],
        help="convert a GGUF model (a KEY or a file) into an MLX model folder",
        description="Dequantize a GGUF model, rebuild its tokenizer and quantize it for MLX. "
        "The folder goes to <models dir>/mlx/<name> (or --out), where SpecDeck finds it.",
    )
    import_mlx.add_argument("source", metavar="KEY|PATH", help="a model key or a GGUF file")
    import_mlx.add_argument("--out", type=Path, default=None, help="the MLX folder to write")
    import_mlx.add_argument("--bits", type=int, default=4, choices=(4, 8), help="default: 4")
    import_mlx.add_argument("--force", action="store_true", help="replace an existing folder")
    hub_token = _ArgumentParser(add_help=False)
    hub_token.add_argument(
        "--token", default=None, help="a Hugging Face token (default: the one saved by 'login')"
    )
    search = commands.add_parser(
        "search",
        parents=[common, hub_token],
        help="search the Hugging Face hub for GGUF (or --mlx) model repos",
    )
    search.add_argument("query", metavar="QUERY")
    search.add_argument("--mlx", action="store_true", help="MLX repos (Apple Silicon)")
    search.add_argument("--limit", type=int, default=20, help="default: 20")
    files = commands.add_parser(
        "files",
        parents=[common, hub_token],
        help="a hub repo's GGUF files: quantization, size, whether it fits, draft verdicts",
        description="List a repo's GGUF files. With --draft-for MAIN.gguf each file's header "
        "(its first megabytes, not its weights) is read to say whether it can draft for MAIN.",
    )
    files.add_argument("repo", metavar="OWNER/REPO")
    files.add_argument("--draft-for", type=Path, default=None, metavar="MAIN.gguf")
    files.add_argument(
        "--ctx",
        type=int,
        default=None,
        help="the context a file's fit is judged at, once its header is read (with "
        f"--draft-for); default: {DEFAULT_CONTEXT_SIZE}",
    )
    download = commands.add_parser(
        "download",
        parents=[common, hub_token],
        help="download a GGUF file from the hub into the models folder (resumes a part)",
    )
    download.add_argument("repo", metavar="OWNER/REPO")
    download.add_argument("filename", metavar="FILE")
    login = commands.add_parser(
        "login", parents=[common], help="save a Hugging Face token (gated repos need one)"
    )
    login.add_argument("--token", default=None, help="the token (default: asked for)")
    return parser


def _run_search(query: str, mlx: bool, limit: int, token: str | None) -> int:
    from backends.models.hub import search

    repos = search(query, "mlx" if mlx else "llama.cpp", limit=limit, token=token)
    if not repos:
        print(f"no {'MLX' if mlx else 'GGUF'} repos match {query!r}", file=sys.stderr)
        return 0
    rows = [("REPO", "DOWNLOADS", "LIKES", "ACCESS")]
    rows += [
        (repo.repo_id, f"{repo.downloads:,}", f"{repo.likes:,}", "gated" if repo.gated else "open")
        for repo in repos
    ]
    _print_table(rows)
    return 0


def _run_files(repo_id: str, draft_for: Path | None, token: str | None, n_ctx: int) -> int:
    from backends.engines.hardware import available_memory, gpu_free_memory
    from backends.models.draft_verdict import draft_verdict
    from backends.models.gguf_info import read_model_info
    from backends.models.hub import cached_copy, fits_here, gguf_files, remote_model_info
    from backends.service.hub_drafts import fits_at_context

    main = read_model_info(draft_for) if draft_for is not None else None
    ram_free, gpu_free = available_memory(), gpu_free_memory()
    rows = [("FILE", "QUANT", "SIZE", "FITS HERE", *(("AS DRAFT",) if main else ()))]
    for file in gguf_files(repo_id, token=token):
        fits = fits_here(file.size, ram_free, gpu_free)
        verdict: tuple[str, ...] = ()
        if main is not None:
            try:
                info = remote_model_info(file, token=token)
            except SpecDeckError as error:  # gated, unreachable, not a model: this row only
                verdict = (str(error),)
            else:
                fits = fits_at_context(info, n_ctx, ram_free, gpu_free)  # from its header
                verdict = (draft_verdict(main, info).summary,)
        if file.layout == "file" and cached_copy(file) is not None:
            fits += " (in the HF cache)"
        rows.append((file.filename, file.quantization, human_size(file.size), fits, *verdict))
    _print_table(rows)
    return 0


def _run_download(
    repo_id: str, filename: str, token: str | None, models_folder: Path | None
) -> int:
    from backends.models.hub import download, gguf_files
    from backends.models.provision import ProvisionProgress
    from backends.paths import models_dir

    chosen = [file for file in gguf_files(repo_id, token=token) if file.filename == filename]
    if not chosen:
        raise ProvisioningError(f"{repo_id} has no GGUF file {filename!r} (see: {PROG} files)")
    file = chosen[0]
    bar = TextProgressBar(sys.stderr)

    def show(done: int, total: int) -> None:
        bar(ProvisionProgress(filename, "download", done, total, f"downloading {filename}"))

    try:
        path = download(file, models_folder or models_dir(), progress=show, token=token)
    finally:
        bar.finish()
    print(path)
    return 0


def _run_login(token: str | None) -> int:
    import getpass

    from backends.models.hub import login

    login(token or getpass.getpass("Hugging Face token: "))
    print("logged in: the token is kept where huggingface_hub keeps its login", file=sys.stderr)
    return 0


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]))


def _run_import_mlx(
    source: str, out: Path | None, bits: int, force: bool, models_folder: Path | None
) -> int:
    from backends.models.gguf_to_mlx import ImportProgressBar, import_gguf, mlx_folder_for

    if source in MODELS:
        gguf_path = model_path(source, models_folder)
        if model_state(source, models_folder) is not ModelState.VERIFIED:
            raise ProvisioningError(
                f"{source} is not here yet (run: {PROG} fetch {source}, then import again)"
            )
    else:
        gguf_path = Path(source)
    target = out or mlx_folder_for(gguf_path, models_folder)
    bar = ImportProgressBar(sys.stderr, gguf_path.stem)
    folder = import_gguf(gguf_path, target, progress=bar, bits=bits, overwrite=force)
    print(folder)
    return 0


def _keys_to_fetch(keys: Sequence[str], fetch_all: bool, default_pair: bool) -> list[str]:
    chosen = list(keys)
    if fetch_all:
        chosen += list(MODELS)
    if default_pair or not chosen:
        chosen += [DEFAULT_MAIN_KEY, DEFAULT_DRAFT_KEY]
    for key in chosen:
        model_source(key)  # unknown keys fail before anything is downloaded
    return list(dict.fromkeys(chosen))


def _run_fetch(keys: Sequence[str], models_folder: Path | None) -> int:
    progress_bar = TextProgressBar(sys.stderr)
    for key in keys:
        try:
            path = ensure_model(key, progress_bar, models_folder)
        finally:
            progress_bar.finish()
        print(f"{key}: ready", file=sys.stderr)
        print(path)
    return 0


def _run_list(models_folder: Path | None) -> int:
    rows = [("KEY", "TITLE", "SIZE", "STATE", "PATH")]
    for key, source in MODELS.items():
        rows.append(
            (
                key,
                source.title,
                human_size(source.size),
                model_state(key, models_folder).value,
                str(model_path(key, models_folder)),
            )
        )
    _print_table(rows)
    return 0


def _run_path(key: str, models_folder: Path | None) -> int:
    state = model_state(key, models_folder)
    path = model_path(key, models_folder)
    if state is not ModelState.VERIFIED:
        raise ProvisioningError(f"{key} is {state.value} at {path} (run: {PROG} fetch {key})")
    print(path)
    return 0


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """The ``specdeck-models`` command; returns its exit status.

    ``fetch [KEY ...] [--all] [--default-pair]``, ``list``, ``path KEY``,
    ``import-mlx KEY|PATH [--out DIR] [--bits 4|8] [--force]``; from the Hugging Face hub:
    ``search QUERY [--mlx]``, ``files REPO [--draft-for MAIN.gguf]``,
    ``download REPO FILE``, ``login``. Errors are one line
    on stderr and exit status 1, never a traceback.
    """
    try:
        args = _build_parser().parse_args(argv)
    except _UsageError as error:
        return _fail(str(error))
    except SystemExit as exit_request:  # --help
        return exit_request.code if isinstance(exit_request.code, int) else 0
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format=f"{PROG}: %(message)s",
    )
    models_folder: Path | None = args.models_dir
    try:
        if args.command == "fetch":
            keys = _keys_to_fetch(args.keys, args.all, args.default_pair)
            return _run_fetch(keys, models_folder)
        if args.command == "list":
            return _run_list(models_folder)
        if args.command == "search":
            return _run_search(args.query, args.mlx, args.limit, args.token)
        if args.command == "files":
            if args.ctx is not None and args.draft_for is None:
                return _fail("--ctx needs --draft-for (a file's header is read only with it)")
            if args.ctx is not None and args.ctx < 1:
                return _fail(f"--ctx must be at least 1 token: {args.ctx}")
            n_ctx = DEFAULT_CONTEXT_SIZE if args.ctx is None else args.ctx
            return _run_files(args.repo, args.draft_for, args.token, n_ctx)
        if args.command == "download":
            return _run_download(args.repo, args.filename, args.token, models_folder)
        if args.command == "login":
            return _run_login(args.token)
        if args.command == "import-mlx":
            return _run_import_mlx(args.source, args.out, args.bits, args.force, models_folder)
        return _run_path(args.key, models_folder)
    except SpecDeckError as error:
        return _fail(str(error))
    except OSError as error:
        return _fail(str(error))
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except Exception as error:  # a bug; the user still gets one line, --verbose the traceback
        logger.debug("unexpected error", exc_info=True)
        return _fail(f"unexpected {type(error).__name__}: {error}")


if __name__ == "__main__":
    sys.exit(main())
