"""The pair service: the one place a pair is opened, answered, compared and tuned on."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from backends.engines.interface import ChatMessage
from backends.engines.load_guard import SAFEST, CrashRecords, LoadRefusedError, RiskySettings
from backends.errors import IncompatiblePairError, SettingsError, SpecDeckError
from backends.models import gguf_to_mlx, provision
from backends.models.catalog import read_catalog_model
from backends.paths import DATA_DIR_ENV
from backends.service import bench, loaded_pair, serve_cli
from backends.service.bench_watch import WORKER_ENV
from backends.service.loaded_pair import check_files, crash_safe_request, open_pair
from backends.service.protocol import LoadRequest
from backends.speculation.types import GenerationSettings
from tests.conftest import TEST_CONTEXT

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from backends.service.protocol import RunKind
    from backends.speculation.types import GenerationUpdate

SERVE = [sys.executable, "-m", "backends.service.serve_cli"]


def test_the_files_are_checked_without_loading(
    smollm_path: Path, gemma_path: Path, tmp_path: Path
) -> None:
    files = check_files(LoadRequest(str(smollm_path), str(smollm_path)))
    assert files.main.path == files.draft.path == smollm_path  # type: ignore[union-attr]
    assert not files.import_draft
    with pytest.raises(SpecDeckError, match="nope.gguf"):
        check_files(LoadRequest(str(tmp_path / "nope.gguf")))
    with pytest.raises(IncompatiblePairError, match="incompatible pair"):
        check_files(LoadRequest(str(smollm_path), str(gemma_path)))
    with pytest.raises(SettingsError, match="is a GGUF model; the mlx engine reads MLX models"):
        check_files(LoadRequest(str(smollm_path), engine="mlx"))


def test_the_crash_records_choose_the_settings_and_say_why(
    smollm_path: Path, tmp_path: Path
) -> None:
    records = CrashRecords(tmp_path / "load-crashes.json")
    request = LoadRequest(str(smollm_path), str(smollm_path), weight_repacking="on")
    assert crash_safe_request(request, records) == (request, None)
    records.record(smollm_path, request.risky, "main-probe", "SIGSEGV")
    safe, note = crash_safe_request(request, records)
    assert safe.risky == SAFEST
    assert (safe.main_path, safe.draft_path, safe.method) == (
        request.main_path,
        request.draft_path,
        request.method,
    )
    assert note is not None
    assert note.startswith(f"safest settings: {smollm_path.name} crashed the engine on ")
    records.record(smollm_path, SAFEST, "main-model", "SIGSEGV")
    with pytest.raises(LoadRefusedError, match="will not load it again by itself"):
        crash_safe_request(request, records)


def test_a_pair_beyond_the_free_memory_is_refused_before_loading(
    smollm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loaded_pair, "available_memory", lambda: 20 << 20)  # 20 MB free
    opened: list[object] = []
    monkeypatch.setattr(loaded_pair, "open_engine", lambda *a, **k: opened.append(a))
    with pytest.raises(SpecDeckError, match="^not enough memory: the models need about"):
        open_pair(LoadRequest(str(smollm_path), str(smollm_path)))
    assert opened == []


class _Runs:
    """Records what an answer's observer hears."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, RunKind, bool]] = []

    def run_started(self, run: RunKind, prompt_tokens: int) -> None:
        assert prompt_tokens > 0
        self.heard.append(("started", run, False))

    def round_done(self, run: RunKind, update: GenerationUpdate) -> None:
        self.heard.append(("round", run, update.finished))


def test_one_pair_answers_compares_and_opens_trial_drafts(smollm_path: Path) -> None:
    request = LoadRequest(
        str(smollm_path), str(smollm_path), method="draft-model", n_ctx=TEST_CONTEXT
    )
    user = [ChatMessage("user", "Count from one to ten in words.")]
    settings = GenerationSettings(max_tokens=16)
    with open_pair(request) as pair:
        runs = _Runs()
        answer = pair.answer(user, settings, compare=True, observer=runs)
        assert [(kind, run) for kind, run, _ in runs.heard if kind == "started"] == [
            ("started", "speculative"),
            ("started", "plain"),
        ]
        finals = [run for kind, run, finished in runs.heard if finished]
        assert finals == ["speculative", "plain"]  # each run's last round, once
        comparison = answer.comparison
        assert comparison is not None
        assert comparison.identical is True
        assert comparison.baseline.text == answer.results["speculative"].text
        assert comparison.speedup == pytest.approx(
            answer.results["speculative"].stats.tokens_per_second
            / answer.results["plain"].stats.tokens_per_second
        )
        # The benchmark's comparison: from empty caches, the same verdict.
        cold = pair.compare(user, settings, method="draft-model", warmup=False)
        assert cold.identical is True
        assert cold.prompt_tokens == comparison.prompt_tokens
        assert cold.baseline.text == comparison.baseline.text
        # The pair's own draft is lent to the trials, never loaded twice nor closed.
        with pair.open_trial_draft(read_catalog_model(smollm_path)) as draft:
            assert draft is pair.draft
        assert pair.answer(user, settings).results["speculative"].text == cold.baseline.text


def test_serve_refuses_a_pair_that_crashed_with_the_safest_settings_before_listening(
    smollm_path: Path, tmp_path: Path
) -> None:
    CrashRecords(tmp_path / "load-crashes.json").record(smollm_path, SAFEST, "main-probe", "x")
    done = subprocess.run(
        [*SERVE, "--main", str(smollm_path), "--no-draft"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, DATA_DIR_ENV: str(tmp_path)},
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("specdeck serve: error: SmolLM2-135M-Instruct.Q4_1.gguf crashed")
    assert "will not load it again by itself" in lines[0]
    assert "listening" not in done.stderr


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], ("main.gguf", "draft.gguf")),
        (["--main", "mine.gguf"], ("mine.gguf", None)),
        (["--draft", "small.gguf"], ("main.gguf", "small.gguf")),
        (["--main", "mine.gguf", "--draft", "small.gguf"], ("mine.gguf", "small.gguf")),
        (["--engine", "mlx"], ("mlx/main", "draft.gguf")),
        (["--engine", "mlx", "--main", "mine.gguf"], ("mlx/mine", None)),
    ],
)
def test_bench_and_serve_resolve_the_same_pair_from_the_same_flags(
    flags: list[str],
    expected: tuple[str, str | None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The default pair and the MLX import are stand-ins: this is about which files each
    # command line asks for, the same in both (a GGUF main model imported for --engine mlx).
    for name in ("main.gguf", "draft.gguf", "mine.gguf", "small.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    default_pair = {
        provision.DEFAULT_MAIN_KEY: "main.gguf",
        provision.DEFAULT_DRAFT_KEY: "draft.gguf",
    }
    monkeypatch.setattr(
        provision, "ensure_model", lambda key, _progress: tmp_path / default_pair[key]
    )
    imported: list[Path] = []

    def mlx_import(gguf: Path, _progress: object) -> Path:
        imported.append(gguf)
        return tmp_path / "mlx" / gguf.stem

    monkeypatch.setattr(gguf_to_mlx, "ensure_mlx_import", mlx_import)
    monkeypatch.setenv(WORKER_ENV, str(tmp_path / "stages"))  # bench's measuring process
    asked: list[tuple[Path, Path | None]] = []

    def request(
        _args: argparse.Namespace, main: Path, draft: Path | None, _method: str
    ) -> LoadRequest:
        asked.append((main, draft))
        raise SettingsError("resolved")  # each command line stops here, with an exit status

    for cli in (bench, serve_cli):
        monkeypatch.setattr(cli, "request_from_args", request)
    argv = [str(tmp_path / flag) if flag.endswith(".gguf") else flag for flag in flags]
    assert bench.main([*argv, "--debug"]) == 1
    assert serve_cli.main([*argv, "--debug"]) == serve_cli.EXIT_BAD_SETTINGS
    main, draft = expected
    resolved = (tmp_path / main, None if draft is None else tmp_path / draft)
    assert asked == [resolved, resolved]  # bench's, then serve's
    assert len(imported) == (2 if "mlx" in flags else 0)


def test_risky_settings_pass_through_when_nothing_crashed(tmp_path: Path) -> None:
    request = LoadRequest("main.gguf", gpu_layers=3, n_threads=2, weight_repacking="off")
    safe, note = crash_safe_request(request, CrashRecords(tmp_path / "none.json"))
    assert safe.risky == RiskySettings("off", 3, 2)
    assert note is None
