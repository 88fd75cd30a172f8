"""Screenshots of the real app: load a pair, ask a coding question with comparison on, save PNGs.

``python -m gui.screenshots OUT_DIR`` (``scripts/screenshots`` runs it under Xvfb). It uses
the user's data dir unless ``SPECDECK_DATA_DIR`` points elsewhere; the script sets it to a
fresh folder so the shots never show someone's own chats.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PySide6.QtCore import QEventLoop, QTimer, SignalInstance
from PySide6.QtWidgets import QApplication, QWidget

from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, ensure_model
from backends.service.protocol import ENGINE_KINDS
from backends.service.suite_prompts import SUITE_PROMPTS
from gui.app import prefer_default_pair
from gui.app_info import APP_NAME
from gui.main_window import MainWindow
from gui.settings import THEMES, AppSettings

# A code rewrite (the benchmark suite's "type-hints" prompt): the kind of coding request where
# speculation pays on any machine, because the answer repeats most of the prompt.
QUESTION = next(prompt.text for prompt in SUITE_PROMPTS if prompt.key == "type-hints")
ANSWER_TIMEOUT_MS = 600_000
SETTLE_MS = 400


def _wait(signal: SignalInstance, timeout_ms: int) -> bool:
    """Run the event loop until ``signal`` fires (True) or the timeout passes (False)."""
    loop = QEventLoop()
    fired = []

    def done(*_args: object) -> None:
        fired.append(True)
        loop.quit()

    signal.connect(done)
    _quit_after(loop, timeout_ms)
    loop.exec()
    signal.disconnect(done)
    return bool(fired)


def _quit_after(loop: QEventLoop, ms: int) -> None:
    # A timer owned by the loop dies with it (a bare singleShot would outlive the loop).
    timer = QTimer(loop)
    timer.setSingleShot(True)
    timer.timeout.connect(loop.quit)
    timer.start(ms)


def _settle(ms: int = SETTLE_MS) -> None:
    loop = QEventLoop()
    _quit_after(loop, ms)
    loop.exec()


def _save(widget: QWidget, path: Path) -> None:
    widget.grab().save(str(path))
    print(f"saved {path}")


def main(argv: list[str] | None = None) -> int:
    """Take the screenshots; returns non-zero when the app did not answer."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, help="folder for the PNG files")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--engine",
        choices=ENGINE_KINDS,
        default="llama.cpp",
        help="mlx: the default pair imported into MLX folders (imported now if need be)",
    )
    parser.add_argument("--main", type=Path, help="a GGUF main model (default: the default pair)")
    parser.add_argument("--draft", type=Path, help="its draft (default: --main itself)")
    parser.add_argument(
        "--json-schema",
        type=Path,
        help="a JSON schema file: answer with Structured output (the grammar's tokens on blue)",
    )
    parser.add_argument(
        "--regenerate",
        action="store_true",
        help="then regenerate the answer (comparison off) and shoot its ‹ 2/2 › switcher",
    )
    parser.add_argument(
        "--theme", choices=THEMES, default="light", help="the window's colours (default: light)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    pair = [ensure_model(DEFAULT_MAIN_KEY), ensure_model(DEFAULT_DRAFT_KEY)]
    if args.main is not None:
        pair = [args.main, args.draft or args.main]
    if args.engine == "mlx":
        from backends.models.gguf_to_mlx import ImportProgressBar, ensure_mlx_import

        pair = [ensure_mlx_import(path, ImportProgressBar(sys.stderr, path.stem)) for path in pair]

    app = QApplication(sys.argv[:1])
    app.setApplicationName(APP_NAME)
    prefer_default_pair()
    settings = AppSettings()
    settings.set("engine", args.engine)
    if args.engine == "mlx" or args.main is not None:
        settings.set("last_main_path", str(pair[0]))
        settings.set("last_draft_choice", str(pair[1]))
    settings.set("theme", args.theme)
    settings.set("compare", True)
    settings.set("max_tokens", args.max_tokens)
    if args.json_schema is not None:
        settings.set("structured_output", "json_schema")
        settings.set("json_schema", args.json_schema.read_text())
    window = MainWindow(settings, offer_first_run=False)
    window.resize(1500, 940)
    window.show()
    window.load_when_scanned()
    if not _wait(window.models_loaded, ANSWER_TIMEOUT_MS):
        print("the models did not load", file=sys.stderr)
        return 1
    _settle()
    _save(window, args.out / "window-loaded.png")
    _save(window.sidebar, args.out / "sidebar.png")
    finished: list[object] = []  # a short answer may end before the streaming shots
    window.answer_finished.connect(finished.append)
    window.input.setPlainText(args.question)
    window.send_message()
    _settle(3000)
    _save(window, args.out / "window-streaming.png")
    _save(window.meter, args.out / "meter-live.png")
    if not finished and not _wait(window.answer_finished, ANSWER_TIMEOUT_MS):
        print("no answer in time", file=sys.stderr)
        return 1
    _settle()
    _save(window, args.out / "window-compared.png")
    _save(window.chat, args.out / "chat-highlighted.png")
    _save(window.compare_view, args.out / "comparison.png")
    _save(window.meter, args.out / "meter-done.png")
    if args.regenerate:
        window.compare_toggle.setChecked(False)
        window.regenerate()
        if not _wait(window.answer_finished, ANSWER_TIMEOUT_MS):
            print("no regenerated answer in time", file=sys.stderr)
            return 1
        _settle()
        window.chat.scroll_to_answer(-1)
        _settle()
        _save(window.chat, args.out / "chat-alternatives.png")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
