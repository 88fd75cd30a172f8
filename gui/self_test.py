"""``specdeck --self-test``: the real window, offscreen, answers once with speculation; exit 0.

Used on built bundles (CI installs the .deb and runs it): it proves that Qt, its platform
plugin, llama.cpp's shared libraries, the engine process (the app started again with
``--engine-server``) and the history all work in the frozen app. Chats and settings go to a
temporary data dir; models are read from the usual models folder.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import TYPE_CHECKING

from backends.models.provision import SMALL_TEST_KEY, ModelState, model_path, model_state
from backends.paths import DATA_DIR_ENV, MODELS_DIR_ENV, models_dir

if TYPE_CHECKING:
    from pathlib import Path

    from PySide6.QtCore import SignalInstance

SELF_TEST_TIMEOUT_MS = 300_000
SELF_TEST_QUESTION = "List the first five prime numbers."
SELF_TEST_TOKENS = 24


def default_self_test_model() -> Path | None:
    """The small test model when it has been fetched (it drafts for itself)."""
    if model_state(SMALL_TEST_KEY) is ModelState.MISSING:
        return None
    return model_path(SMALL_TEST_KEY)


def _wait(
    signal: SignalInstance, timeout_ms: int, *, unless: SignalInstance | None = None
) -> list[object] | None:
    """Run the event loop until ``signal`` fires; its arguments, or None on timeout.

    ``unless`` ends the wait at once too (a load that gave up), also returning None.
    """
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    received: list[list[object]] = []

    def done(*args: object) -> None:
        received.append(list(args))
        loop.quit()

    signal.connect(done)
    if unless is not None:
        unless.connect(loop.quit)
    timer = QTimer(loop)
    timer.setSingleShot(True)
    timer.timeout.connect(loop.quit)
    timer.start(timeout_ms)
    loop.exec()
    signal.disconnect(done)
    if unless is not None:
        unless.disconnect(loop.quit)
    return received[0] if received else None


def run_self_test(main: Path | None, draft: Path | None) -> int:
    """Load the pair in the real window, answer once, check highlights and stats."""
    main = main or default_self_test_model()
    if main is None:
        print(
            "self-test: no model to test with; pass --main FILE (and --draft FILE), or fetch "
            "the small test model with: specdeck-models fetch smollm2-135m-instruct-q4_1",
            file=sys.stderr,
        )
        return 2
    draft = draft or main
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ[MODELS_DIR_ENV] = str(models_dir())
    with tempfile.TemporaryDirectory(prefix="specdeck-self-test-") as data_dir:
        os.environ[DATA_DIR_ENV] = data_dir
        return _self_test_in_window(main.resolve(), draft.resolve())


def _self_test_in_window(main: Path, draft: Path) -> int:
    from PySide6.QtWidgets import QApplication

    from backends.speculation.types import TokenOrigin
    from gui.main_window import MainWindow
    from gui.markdown_layout import shown_text_of
    from gui.settings import AppSettings

    app = QApplication.instance() or QApplication(sys.argv[:1])
    settings = AppSettings()
    settings.set("last_main_path", str(main))
    settings.set("last_draft_choice", str(draft))
    settings.set("speculation_method", "draft-model")
    settings.set("max_tokens", SELF_TEST_TOKENS)
    settings.set("context_size", 1024)
    window = MainWindow(settings, offer_first_run=False)
    window.show()
    failures: list[str] = []
    errors: list[str] = []
    window.client.failed.connect(lambda message, _request: errors.append(message))
    window.client.crashed.connect(lambda message, _death: errors.append(message))
    window.load_gave_up.connect(errors.append)
    try:
        window.load_when_scanned()
        # An engine that dies while loading is retried once; when that is over too, the
        # window gives up at once and so does the self-test (never waits out the timeout).
        if _wait(window.models_loaded, SELF_TEST_TIMEOUT_MS, unless=window.load_gave_up) is None:
            reasons = "; ".join(dict.fromkeys(errors)) or "no answer from the engine"
            print(f"self-test: FAILED: the models did not load: {reasons}", file=sys.stderr)
            return 1
        placement = window.sidebar.placement_text()
        if window.crash_banner.isVisible():
            print(f"self-test: {window.crash_label.text()}", file=sys.stderr)
        drafted: list[str] = []
        window.client.tokens_arrived.connect(
            lambda _id, _run, tokens, _stats: drafted.extend(
                t.text for t in tokens if t.origin is TokenOrigin.DRAFT
            )
        )
        window.client.run_finished.connect(
            lambda _id, _run, tokens, _stats: drafted.extend(
                t.text for t in tokens if t.origin is TokenOrigin.DRAFT
            )
        )
        window.input.setPlainText(SELF_TEST_QUESTION)
        window.send_message()
        finished = _wait(window.answer_finished, SELF_TEST_TIMEOUT_MS)
        if finished != ["complete"]:
            failures.append(f"the answer ended with {finished}: {'; '.join(errors)}")
        record = window.store.messages(window.conversation_id or 0)[-1]
        stats = record.stats
        origins = [span.origin for span in record.spans for _ in range(span.length)]
        stored_drafts = "".join(
            character
            for character, origin in zip(record.content, origins, strict=False)
            if origin is TokenOrigin.DRAFT
        )
        if stats is None or stats.accepted_draft_tokens_count == 0:
            failures.append("no draft token was accepted")
        elif stored_drafts != "".join(drafted):
            failures.append("the stored answer's draft tokens are not those the engine sent")
        elif window.chat.highlighted_text() != shown_text_of(
            record.content, origins, TokenOrigin.DRAFT
        ):
            failures.append("the green highlight does not match the accepted draft tokens")
        elif window.meter.overall_acceptance != stats.acceptance_rate:
            failures.append("the meter does not show the answer's acceptance")
        if getattr(sys, "frozen", False):
            from gui.about import build_info

            if not build_info().get("version"):
                failures.append("the bundle lacks its build record (build_info.json)")
        if failures:
            print("self-test: FAILED: " + "; ".join(failures), file=sys.stderr)
            return 1
        assert stats is not None
        print(
            f"self-test: ok: {main.name} with {draft.name}; {placement.replace(chr(10), '; ')}; "
            f"{stats.generated_tokens} tokens, {stats.accepted_draft_tokens_count}/"
            f"{stats.total_draft_tokens_count} drafts accepted, "
            f"{stats.tokens_per_second:.1f} tok/s"
        )
        return 0
    finally:
        window.shutdown()
        window.close()
        app.processEvents()
