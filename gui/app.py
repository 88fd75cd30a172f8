"""SpecDeck's entry point: ``specdeck`` opens the window (the engine runs in a child process).

``specdeck serve …`` runs the OpenAI-compatible local API without a window
(:mod:`backends.service.serve_cli`); ``specdeck worker …`` lends this machine to another
SpecDeck's main model (:mod:`backends.service.worker_cli`).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from backends.paths import user_data_dir
from gui.app_info import APP_NAME, app_version

if TYPE_CHECKING:
    from types import TracebackType

    from gui.main_window import MainWindow

log = logging.getLogger("gui")

LOG_FILE = "specdeck.log"
PIP_FLAG = "--pip"  # must match backends.models.provision's frozen download command
MODELS_FLAG = "--models"  # the frozen app's specdeck-models: "specdeck --models fetch …"
SERVE_COMMAND = "serve"  # "specdeck serve --port 8765": the local API, no window
WORKER_COMMAND = "worker"  # "specdeck worker --port 50052": llama.cpp's RPC server


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``specdeck``."""
    parser = argparse.ArgumentParser(
        prog="specdeck", description="SpecDeck: faster local LLM answers, shown as they happen."
    )
    parser.add_argument(
        "--load",
        action="store_true",
        help="load the selected model pair (the default pair on first start) once the window opens",
    )
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="open the window offscreen, load a small pair, answer once with speculation, "
        "check the highlights and stats, exit 0 on success",
    )
    parser.add_argument("--main", type=Path, help="with --self-test: the main model file")
    parser.add_argument("--draft", type=Path, help="with --self-test: the draft model file")
    parser.add_argument("--version", action="version", version=f"{APP_NAME} {app_version()}")
    # The frozen app has no separate Python to run the engine process with: it runs itself.
    parser.add_argument("--engine-server", action="store_true", help=argparse.SUPPRESS)
    return parser


def _log_to_file() -> None:
    folder = user_data_dir()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(folder / LOG_FILE, encoding="utf-8"))
    except OSError:
        pass
    logging.basicConfig(
        level=logging.INFO, handlers=handlers, format="%(asctime)s %(name)s: %(message)s"
    )


def _display_problem() -> str | None:
    """Why no window can open here (Qt would abort the process instead of saying so)."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    return (
        "no display: neither DISPLAY nor WAYLAND_DISPLAY is set; start SpecDeck from a "
        "desktop session (specdeck --self-test works without one)"
    )


def _install_excepthook(window: MainWindow) -> None:
    """An unexpected error in a slot becomes a logged traceback and a one-line status message."""

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        log.error("unexpected error:\n%s", "".join(traceback.format_exception(kind, error, tb)))
        window.statusBar().showMessage(f"Unexpected error: {kind.__name__}: {error}", 15000)

    sys.excepthook = hook


def prefer_default_pair() -> None:
    """On the very first start, preselect the default pair when it has been fetched."""
    from backends.models.provision import (
        DEFAULT_DRAFT_KEY,
        DEFAULT_MAIN_KEY,
        ModelState,
        model_path,
        model_state,
    )
    from gui.settings import AppSettings

    settings = AppSettings()
    if settings.get("last_main_path"):
        return
    if model_state(DEFAULT_MAIN_KEY) is ModelState.MISSING:
        return
    settings.set("last_main_path", str(model_path(DEFAULT_MAIN_KEY)))
    if model_state(DEFAULT_DRAFT_KEY) is not ModelState.MISSING:
        settings.set("last_draft_choice", str(model_path(DEFAULT_DRAFT_KEY)))


def main(argv: list[str] | None = None) -> int:
    """Open the window; returns the exit code."""
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == [PIP_FLAG]:
        # The frozen app has no Python to run "-m pip" with: model downloads run pip here.
        from pip._internal.cli.main import main as pip_main

        return int(pip_main(arguments[1:]))
    if arguments[:1] == [MODELS_FLAG]:
        from backends.service.models_cli import main as models_main

        return models_main(arguments[1:])
    if arguments[:1] == [SERVE_COMMAND]:
        from backends.service.serve_cli import main as serve_main

        return serve_main(arguments[1:])
    if arguments[:1] == [WORKER_COMMAND]:
        from backends.service.worker_cli import main as worker_main

        return worker_main(arguments[1:])
    args = build_parser().parse_args(arguments)
    if args.engine_server:
        from backends.service.engine_server import main as serve

        serve()
    if args.self_test:
        from gui.self_test import run_self_test

        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
        return run_self_test(args.main, args.draft)
    if problem := _display_problem():
        print(f"specdeck: error: {problem}", file=sys.stderr)
        return 2
    _log_to_file()
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from gui.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    app.setApplicationName(APP_NAME)
    app.setApplicationVersion(app_version())
    app.setDesktopFileName("specdeck")
    icon = QIcon.fromTheme("specdeck")
    if not icon.isNull():
        app.setWindowIcon(icon)
    prefer_default_pair()
    window = MainWindow()
    _install_excepthook(window)
    if args.load:
        window.load_when_scanned()
    window.show()
    # What startup made (modules, Qt wrappers: some 60,000 objects) lives as long as the
    # app: kept out of the collector's sight, a full collection no longer scans it (it
    # held the event loop for 34 ms on a 2-core EPYC Zen 4, and answers stream meanwhile).
    gc.freeze()
    code = app.exec()
    window.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
