"""The hub stand-in (tests/hub_standin.py) under the real huggingface_hub client, on real files."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("huggingface_hub", minversion="1.0", reason="huggingface_hub is not installed")

import httpx2
from huggingface_hub import (
    HfApi,
    close_session,
    constants,
    file_download,
    hf_hub_download,
    hf_hub_url,
)
from huggingface_hub.errors import (
    GatedRepoError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.hub_standin import (
    HubRepo,
    HubStandin,
    git_blob_id,
    instant_client_retries,
    point_client_at,
    serve_hub,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

SMOL = "specdeck-test/SmolLM2-135M-Instruct-GGUF"
TINY = "specdeck-test/tiny-GGUF"
GATED = "specdeck-test/gated-GGUF"
TOKEN = "hf_standin_valid_token"
TINY_SIZE = 300_001  # odd, so no range lines up with a power of two
README = b"---\nlibrary_name: gguf\n---\n# A model card\n"
# Where the cut drops the real GGUF's body: 2.5 of the client's 10 MiB write chunks.
CUT = 25 * 1024 * 1024
FIRST_64_KIB = 64 * 1024


@pytest.fixture(scope="module")
def smollm_sha256(smollm_path: Path) -> str:
    with smollm_path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tiny-repo")
    tiny = folder / "tiny.gguf"
    tiny.write_bytes(random.Random(7).randbytes(TINY_SIZE))
    readme = folder / "README.md"
    readme.write_bytes(README)
    return {"tiny.gguf": tiny, "README.md": readme}


def repos(smollm_path: Path, tiny_files: dict[str, Path]) -> list[HubRepo]:
    return [
        HubRepo(
            SMOL,
            {smollm_path.name: smollm_path, "README.md": tiny_files["README.md"]},
            tags=("gguf", "llama", "text-generation"),
            downloads=1200,
            likes=12,
        ),
        HubRepo(TINY, tiny_files, downloads=3),
        HubRepo(
            GATED,
            {"tiny.gguf": tiny_files["tiny.gguf"]},
            gated="manual",
            access_tokens=frozenset({TOKEN}),
        ),
    ]


@pytest.fixture
def hub(
    smollm_path: Path,
    tiny_files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[HubStandin]:
    """The three repos, served, with the client pointed at them and its home in tmp_path."""
    with serve_hub(*repos(smollm_path, tiny_files)) as standin:
        point_client_at(standin, tmp_path / "hf-home", monkeypatch)
        yield standin
        close_session()  # its pooled connections lead to this server
    assert not standin.running


def sha256_of(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def gets(hub: HubStandin) -> list[tuple[str | None, int]]:
    """The file GETs as (Range header, bytes of file sent)."""
    return [(r.range, r.body_bytes) for r in hub.file_gets()]


# -- metadata ----------------------------------------------------------------------------------


def test_list_models_searches_ids_and_filters_tags(hub: HubStandin) -> None:
    api = HfApi(endpoint=hub.endpoint)
    assert [m.id for m in api.list_models(search="smollm2", filter="gguf")] == [SMOL]
    assert [m.id for m in api.list_models(search="SmolLM2", filter="safetensors")] == []
    assert [m.id for m in api.list_models(gated=True)] == [GATED]

    top = list(api.list_models(author="specdeck-test", sort="downloads", limit=2, full=True))
    assert [m.id for m in top] == [SMOL, TINY]
    smol = top[0]
    assert smol.author == "specdeck-test"
    assert smol.downloads == 1200
    assert smol.likes == 12
    assert smol.tags is not None
    assert "gguf" in smol.tags
    assert smol.library_name == "gguf"
    assert smol.gated is False
    assert smol.private is False
    assert smol.sha == hub.repos[SMOL].sha
    assert smol.last_modified is not None
    assert smol.siblings is not None
    assert {s.rfilename for s in smol.siblings} == set(hub.repos[SMOL].files)
    # without full=True the hub gives no siblings
    assert next(iter(api.list_models(search="tiny"))).siblings is None
    assert all(r.token is None for r in hub.requests())  # the user's token stayed home


def test_model_info_gives_sizes_and_the_lfs_sha256(
    hub: HubStandin, smollm_path: Path, smollm_sha256: str
) -> None:
    api = HfApi(endpoint=hub.endpoint)
    info = api.model_info(SMOL, files_metadata=True)
    assert info.sha == hub.repos[SMOL].sha
    assert len(info.sha) == 40
    assert info.gated is False
    assert info.tags is not None
    assert "gguf" in info.tags
    assert info.siblings is not None
    siblings = {s.rfilename: s for s in info.siblings}
    gguf = siblings[smollm_path.name]
    assert gguf.size == smollm_path.stat().st_size
    assert gguf.lfs is not None
    assert gguf.lfs.sha256 == smollm_sha256
    assert gguf.lfs.size == gguf.size
    assert gguf.lfs.pointer_size > 100  # the git-lfs pointer file git keeps in its place
    readme = siblings["README.md"]
    assert readme.lfs is None
    assert readme.size == len(README)
    assert readme.blob_id == git_blob_id(README)  # what `git hash-object` gives
    # The commit is a revision too, and without blobs=true the siblings carry only names.
    assert api.model_info(SMOL, revision=info.sha).sha == info.sha
    plain = api.model_info(SMOL)
    assert plain.siblings is not None
    assert all(s.size is None for s in plain.siblings)


def test_list_repo_tree_and_paths_info(hub: HubStandin, smollm_sha256: str) -> None:
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=hub.endpoint)
    tree = {entry.path: entry for entry in api.list_repo_tree(SMOL)}
    assert set(tree) == set(hub.repos[SMOL].files)
    gguf = next(e for e in tree.values() if e.path.endswith(".gguf"))
    assert isinstance(gguf, RepoFile)
    assert gguf.lfs is not None
    assert gguf.lfs.sha256 == smollm_sha256
    assert gguf.xet_hash is None
    [info] = api.get_paths_info(SMOL, ["README.md", "not-there.txt"])
    assert isinstance(info, RepoFile)
    assert info.blob_id == git_blob_id(README)
    with pytest.raises(RepositoryNotFoundError):
        list(api.list_repo_tree("specdeck-test/nope"))


# -- downloads ---------------------------------------------------------------------------------


def test_hf_hub_download_fetches_the_real_gguf(
    hub: HubStandin,
    smollm_path: Path,
    smollm_sha256: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_xet(**_: object) -> None:
        raise AssertionError("the client took its Xet path")

    monkeypatch.setattr(file_download, "xet_get", no_xet)
    cache = tmp_path / "cache"
    path = hf_hub_download(SMOL, smollm_path.name, cache_dir=cache, endpoint=hub.endpoint)
    assert path.startswith(str(cache))
    assert sha256_of(path) == smollm_sha256
    # HEAD on the hub: a redirect carrying the metadata; then one plain GET from the CDN.
    requests = [(r.site, r.method, r.status, r.range) for r in hub.requests()]
    assert requests == [("hub", "HEAD", 302, None), ("cdn", "GET", 200, None)]
    assert gets(hub) == [(None, smollm_path.stat().st_size)]
    assert all(r.token is None for r in hub.requests())
    # Asked again, the cached file answers after a HEAD alone.
    hub.clear_log()
    again = hf_hub_download(SMOL, smollm_path.name, cache_dir=cache, endpoint=hub.endpoint)
    assert again == path
    assert [(r.method, r.site) for r in hub.requests()] == [("HEAD", "hub")]


def test_a_body_cut_once_resumes_with_a_range(
    hub: HubStandin,
    smollm_path: Path,
    smollm_sha256: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses = instant_client_retries(monkeypatch)
    hub.cut_after_bytes, hub.cut_times = CUT, 1
    path = hf_hub_download(SMOL, smollm_path.name, cache_dir=tmp_path / "cache")
    assert sha256_of(path) == smollm_sha256
    # The client keeps only whole 10 MiB chunks of the cut body: it resumes where they end.
    kept = CUT // constants.DOWNLOAD_CHUNK_SIZE * constants.DOWNLOAD_CHUNK_SIZE
    size = smollm_path.stat().st_size
    assert gets(hub) == [(None, CUT), (f"bytes={kept}-", size - kept)]
    assert [r.status for r in hub.file_gets()] == [200, 206]
    assert pauses == [1]


def test_a_body_cut_every_time_fails_and_the_next_call_starts_over(
    hub: HubStandin,
    smollm_path: Path,
    smollm_sha256: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses = instant_client_retries(monkeypatch)
    cache = tmp_path / "cache"
    hub.cut_after_bytes = CUT
    with pytest.raises(httpx2.RemoteProtocolError):
        hf_hub_download(SMOL, smollm_path.name, cache_dir=cache)
    kept = CUT // constants.DOWNLOAD_CHUNK_SIZE * constants.DOWNLOAD_CHUNK_SIZE
    # Five resumes from the same offset, none of which brings a whole chunk, then it gives up.
    assert gets(hub) == [(None, CUT)] + [(f"bytes={kept}-", CUT - kept)] * 5
    assert pauses == [1] * 5
    # huggingface_hub 2.4.0 deletes its partial file: nothing is left for a later call.
    assert not [p for p in cache.rglob("*") if p.name.endswith(".incomplete")]
    hub.reset_faults()
    hub.clear_log()
    path = hf_hub_download(SMOL, smollm_path.name, cache_dir=cache)
    assert sha256_of(path) == smollm_sha256
    assert gets(hub) == [(None, smollm_path.stat().st_size)]  # from byte 0 again


def test_http_get_resumes_a_partial_file_with_a_range(
    hub: HubStandin, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    """The client's own primitive, as a resumable downloader calls it across runs."""
    data = tiny_files["tiny.gguf"].read_bytes()
    have = 123_457
    target = tmp_path / "tiny.gguf.part"
    target.write_bytes(data[:have])
    with target.open("ab") as f:
        file_download.http_get(
            hub.resolve_url(TINY, "tiny.gguf"), f, resume_size=have, expected_size=len(data)
        )
    assert target.read_bytes() == data
    assert gets(hub) == [(f"bytes={have}-", len(data) - have)]
    assert [r.status for r in hub.file_gets()] == [206]


def test_a_gated_repo_needs_the_token(hub: HubStandin, tmp_path: Path) -> None:
    api = HfApi(endpoint=hub.endpoint)
    assert api.model_info(GATED).gated == "manual"  # the metadata stays public
    cache = tmp_path / "cache"
    with pytest.raises(GatedRepoError) as no_token:
        hf_hub_download(GATED, "tiny.gguf", cache_dir=cache)
    assert no_token.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as wrong_token:
        hf_hub_download(GATED, "tiny.gguf", cache_dir=cache, token="hf_someone_else")
    assert wrong_token.value.response.status_code == 403
    path = hf_hub_download(GATED, "tiny.gguf", cache_dir=cache, token=TOKEN)
    assert sha256_of(path) == hub.blob(GATED, "tiny.gguf").sha256
    heads = [r.token for r in hub.requests() if r.method == "HEAD"]
    assert heads == [None, "hf_someone_else", TOKEN]
    # The token stays on the hub: the CDN's origin is foreign to the client.
    assert [r.token for r in hub.file_gets()] == [None]


def test_missing_repo_file_and_revision(hub: HubStandin, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(RepositoryNotFoundError) as repo:
        hf_hub_download("specdeck-test/nope", "a.gguf", cache_dir=cache)
    assert not isinstance(repo.value, GatedRepoError)
    assert repo.value.response.status_code == 404
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.endpoint).model_info("specdeck-test/nope")
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(TINY, "nope.gguf", cache_dir=cache)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(TINY, "tiny.gguf", cache_dir=cache, revision="v9")


@pytest.mark.timeout(30)
def test_a_stalled_body_times_out_and_the_server_still_stops_at_once(
    tiny_files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pauses = instant_client_retries(monkeypatch)
    # The client's read timeout for bodies; the HF_HUB_DOWNLOAD_TIMEOUT variable sets it, but
    # only when read at import.
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.25)
    with serve_hub(HubRepo(TINY, tiny_files)) as hub:
        point_client_at(hub, tmp_path / "hf-home", monkeypatch)
        hub.stall_seconds = 60
        started = time.monotonic()
        with pytest.raises(httpx2.ReadTimeout):
            hf_hub_download(TINY, "tiny.gguf", cache_dir=tmp_path / "cache")
        assert time.monotonic() - started < 4
        assert pauses == [1] * 5
        close_session()
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 2
    assert not hub.running
    # The six stalled bodies, woken by stop(), never sent a byte.
    assert gets(hub) == [(None, 0)] * 6


def test_a_range_read_of_the_first_64_kib(hub: HubStandin, smollm_path: Path) -> None:
    url = hf_hub_url(SMOL, smollm_path.name, endpoint=hub.endpoint)
    with httpx2.Client(follow_redirects=True) as client:
        response = client.get(url, headers={"Range": f"bytes=0-{FIRST_64_KIB - 1}"})
    assert response.status_code == 206
    with smollm_path.open("rb") as f:
        assert response.content == f.read(FIRST_64_KIB)
    assert response.content[:4] == b"GGUF"
    size = smollm_path.stat().st_size
    assert response.headers["Content-Range"] == f"bytes 0-{FIRST_64_KIB - 1}/{size}"
    assert gets(hub) == [(f"bytes=0-{FIRST_64_KIB - 1}", FIRST_64_KIB)]


def test_ranges_and_heads_on_both_origins(hub: HubStandin, tiny_files: dict[str, Path]) -> None:
    data = tiny_files["tiny.gguf"].read_bytes()
    blob = hub.blob(TINY, "tiny.gguf")
    cdn = f"{hub.cdn_endpoint}/cdn/{blob.sha256}"
    with httpx2.Client() as client:
        readme = client.head(hub.resolve_url(TINY, "README.md"))
        assert readme.status_code == 200
        assert readme.headers["Content-Length"] == str(len(README))
        assert readme.headers["ETag"] == f'"{git_blob_id(README)}"'
        assert readme.headers["X-Repo-Commit"] == hub.repos[TINY].sha
        tail = client.get(hub.resolve_url(TINY, "README.md"), headers={"Range": "bytes=4-"})
        assert (tail.status_code, tail.content) == (206, README[4:])
        lfs = client.head(hub.resolve_url(TINY, "tiny.gguf"))
        assert lfs.status_code == 302
        assert lfs.headers["Location"] == cdn
        assert lfs.headers["X-Linked-Etag"] == f'"{blob.sha256}"'
        assert lfs.headers["X-Linked-Size"] == str(len(data))
        head = client.head(cdn)
        assert (head.status_code, head.headers["Content-Length"]) == (200, str(len(data)))
        last = client.get(cdn, headers={"Range": "bytes=-10"})
        assert (last.status_code, last.content) == (206, data[-10:])
        past = client.get(cdn, headers={"Range": f"bytes={len(data)}-"})
        assert past.status_code == 416
        assert past.headers["Content-Range"] == f"bytes */{len(data)}"
        answers = [readme, tail, lfs, head, last, past]
    assert not [k for r in answers for k in r.headers if k.lower().startswith("x-xet")]


def test_a_corrupt_body_passes_the_download_but_not_verification(
    hub: HubStandin, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    hub.corrupt = True
    path = hf_hub_download(TINY, "tiny.gguf", cache_dir=cache)  # the client checks no hash
    blob = hub.blob(TINY, "tiny.gguf")
    got, want = Path(path).read_bytes(), tiny_files["tiny.gguf"].read_bytes()
    assert [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b] == [TINY_SIZE // 2]
    report = HfApi(endpoint=hub.endpoint).verify_repo_checksums(TINY, cache_dir=cache)
    assert [(m["path"], m["expected"]) for m in report.mismatches] == [("tiny.gguf", blob.sha256)]
    assert report.missing_paths == ["README.md"]


# -- pointing the client at the stand-in -------------------------------------------------------


def test_module_level_calls_follow_the_patched_constants(hub: HubStandin, tmp_path: Path) -> None:
    import huggingface_hub

    assert huggingface_hub.model_info(TINY).sha == hub.repos[TINY].sha
    path = huggingface_hub.hf_hub_download(TINY, "README.md")  # no endpoint=, no cache_dir=
    assert path.startswith(str(tmp_path / "hf-home" / "hub"))
    assert HfApi().endpoint == hub.endpoint


def test_hf_endpoint_works_in_a_fresh_process(hub: HubStandin, tmp_path: Path) -> None:
    """HF_ENDPOINT and HF_HOME take effect where huggingface_hub is imported after they are set."""
    script = (
        "from huggingface_hub import constants, hf_hub_download\n"
        f"print(constants.ENDPOINT)\nprint(hf_hub_download({TINY!r}, 'README.md'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=os.environ.copy(),  # point_client_at set the variables
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    endpoint, path = done.stdout.split()
    assert endpoint == hub.endpoint
    assert path.startswith(str(tmp_path / "hf-home" / "hub"))


def test_leaving_the_with_closes_both_ports(tiny_files: dict[str, Path]) -> None:
    with serve_hub(HubRepo(TINY, tiny_files)) as hub:
        origins = (hub.endpoint, hub.cdn_endpoint)
        assert httpx2.get(f"{origins[0]}/api/models").json()[0]["id"] == TINY
    assert not hub.running
    for origin in origins:
        with pytest.raises(httpx2.ConnectError):
            httpx2.get(f"{origin}/api/models", timeout=2)
