"""Models from the Hugging Face hub: search, a repo's files, a draft verdict from a header.

Built on ``huggingface_hub``, the hub's own client: its search, its file listings with
sizes and LFS SHA-256, its resumable downloads and its cache and token. What SpecDeck adds:

- :func:`remote_model_info` reads only a GGUF file's header (its metadata and the whole
  vocabulary, the first few megabytes) with HTTP range requests, so that
  :func:`backends.models.draft_verdict.draft_verdict` can judge a draft of gigabytes
  before a byte of its weights is fetched;
- :func:`download` puts a file into SpecDeck's models folder (resumed after a pause, a
  crash or a lost connection from its ``.part`` file, which no catalog lists; a split
  model's shards and an MLX folder's files wait in a hidden folder until all have
  arrived), checks it against the hub's SHA-256 and uses a copy already in the Hugging
  Face cache where it lies;
- every failure (no network, a DNS failure, a gated or missing repo, a stalled
  connection, a full disk) is a :class:`HubError` of one line.

The endpoint is ``HF_ENDPOINT`` when set (read at each call, so a test's stand-in hub
works), else the hub.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from backends.errors import ProvisioningError
from backends.models.gguf_info import HeaderNeedsMoreBytes, ModelInfo, model_info_from_header

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
HEADER_FIRST_READ = 2 << 20  # bytes: a small vocabulary's whole header
HEADER_MAX_READ = 64 << 20  # a header longer than this is not read (none seen is over 10 MB)
TIMEOUT_SECONDS = 20.0  # for each request's connection and each read of it
MEMORY_OVERHEAD = 1.2  # before its header is read: its file's size and a fifth more (context)
HASH_CHUNK = 8 << 20
PART_SUFFIX = ".part"  # a download under way: what arrived so far (no catalog lists it)

HubEngine = Literal["llama.cpp", "mlx"]
# The hub's tag for each engine's files.
ENGINE_TAGS: dict[HubEngine, str] = {"llama.cpp": "gguf", "mlx": "mlx"}
# "Q4_K_M", "IQ2_XXS", "F16", "BF16", "Q8_0" in a GGUF file's name.
_QUANTIZATION_PATTERN = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4)(?![A-Za-z0-9])", re.IGNORECASE
)
_SHARD_PATTERN = re.compile(r"^(?P<stem>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$")
_MLX_BITS_PATTERN = re.compile(r"(\d+)[-_]?bit", re.IGNORECASE)
# An MLX folder's files SpecDeck reads or mlx-lm loads (not READMEs, images, .gitattributes).
_MLX_MEMBER_PATTERN = re.compile(r"\.(safetensors|json|jinja|txt|model|tiktoken|py)$")
MLX_FOLDER = "mlx"  # where MLX folders go in the models folder (as imports do)
# A download of several files waits here, hidden from the catalog, until all have arrived.
STAGING_FOLDER = ".partial"
# What a HubFile stands for: one GGUF file, a split GGUF model's shards, an MLX folder.
FileLayout = Literal["file", "shards", "mlx-folder"]


class HubError(ProvisioningError):
    """A hub request failed; the message is one line naming what and why."""


class DownloadPaused(HubError):
    """A download was paused (or cancelled); what arrived is kept for the next try."""


@dataclass(frozen=True)
class HubRepo:
    """A model repo found on the hub."""

    repo_id: str
    downloads: int
    likes: int
    gated: bool
    tags: tuple[str, ...]


@dataclass(frozen=True)
class HubFile:
    """A model file of a repo, as the hub lists it."""

    repo_id: str
    filename: str
    size: int
    sha256: str | None  # the LFS SHA-256 (None: a small file kept in git)
    revision: str | None = None  # the commit the listing was read at
    layout: FileLayout = "file"
    # The files downloaded together: a split model's shards (``filename`` is the first),
    # an MLX folder's files (``filename`` names the folder).
    members: tuple[HubFile, ...] = ()

    @property
    def is_folder(self) -> bool:
        """Is it an MLX model folder (a whole repo) rather than GGUF files?"""
        return self.layout == "mlx-folder"

    @property
    def quantization(self) -> str:
        """The quantization its name says ("Q4_K_M", "MLX 4-bit"), or "" when it says none."""
        if self.is_folder:
            bits = _MLX_BITS_PATTERN.search(self.filename)
            return f"MLX {bits.group(1)}-bit" if bits else "MLX"
        found = _QUANTIZATION_PATTERN.search(Path(self.filename).name)
        return found.group(1).upper() if found else ""

    @property
    def hub_path(self) -> Path:
        """How SpecDeck names the file in messages: ``hf.co/owner/repo/file.gguf``."""
        return Path("hf.co") / self.repo_id / self.filename


def hub_endpoint() -> str:
    """The hub's address: ``HF_ENDPOINT`` when set, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def search(
    query: str, engine: HubEngine = "llama.cpp", *, limit: int = 20, token: str | None = None
) -> list[HubRepo]:
    """Repos whose name holds ``query`` and that have ``engine``'s files, most downloaded first."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_endpoint(), token=token)
    with _one_line_errors(f"searching the hub for {query!r}"):
        _check_reachable()
        found = api.list_models(
            search=query or None, filter=ENGINE_TAGS[engine], sort="downloads", limit=limit
        )
        return [
            HubRepo(
                repo_id=model.id,
                downloads=int(model.downloads or 0),
                likes=int(model.likes or 0),
                gated=bool(model.gated),
                tags=tuple(model.tags or ()),
            )
            for model in found
        ]


def fits_here(
    size: int, ram_free: int, gpu_free: tuple[int, str] | None, *, needed: int | None = None
) -> str:
    """Whether a model of ``size`` bytes fits in the free RAM (and GPU memory), in words.

    ``needed``: what it needs loaded, once its header has been read (weights and the KV
    cache of the context in use, :func:`backends.engines.hardware.estimate_model_memory`);
    before that, its size and a fifth more.
    """
    if needed is None:
        needed = int(size * MEMORY_OVERHEAD)
    ram = "RAM ✓" if needed <= ram_free else "RAM ✗"
    if gpu_free is None:
        return ram
    return f"{ram} · GPU {'✓' if needed <= gpu_free[0] else '✗'}"


def login(token: str) -> None:
    """Check ``token`` with the hub and keep it where huggingface_hub keeps its login."""
    from huggingface_hub import login as hub_login

    with _one_line_errors("logging in"):
        try:
            hub_login(token=token, add_to_git_credential=False)
        except ValueError as error:  # an organisation token, or one the hub refused
            raise HubError(f"logging in: {_cause(error)}") from None


def _check_reachable() -> None:
    """Raise at once when the hub cannot be reached.

    The client's search retries a refused connection for 23 s (its back-off) before it
    gives up; one plain request says so at once.
    """
    from huggingface_hub import get_session

    get_session().head(hub_endpoint() + "/api/models", timeout=TIMEOUT_SECONDS)


def _repo_files(repo_id: str, token: str | None) -> list[HubFile]:
    """Every file of a repo with its size and LFS SHA-256, at the commit listed."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_endpoint(), token=token)
    with _one_line_errors(f"listing {repo_id}"):
        info = api.model_info(repo_id, files_metadata=True)
    return [
        HubFile(
            repo_id=repo_id,
            filename=sibling.rfilename,
            size=int(sibling.size or (sibling.lfs.size if sibling.lfs else 0)),
            sha256=sibling.lfs.sha256 if sibling.lfs else None,
            revision=info.sha,
        )
        for sibling in info.siblings or ()
    ]


def gguf_files(repo_id: str, *, token: str | None = None) -> list[HubFile]:
    """The GGUF models of a repo with their sizes and SHA-256, smallest first.

    A split model is one entry (``layout`` "shards", named by its first shard, sized by
    all of them), listed only when every shard is there.
    """
    files: list[HubFile] = []
    shards: dict[tuple[str, int], list[HubFile]] = {}
    for file in _repo_files(repo_id, token):
        if not file.filename.lower().endswith(".gguf"):
            continue
        shard = _SHARD_PATTERN.match(file.filename)
        if shard is None:
            files.append(file)
        else:
            shards.setdefault((shard["stem"], int(shard["count"])), []).append(file)
    for (_stem, count), parts in shards.items():
        if len(parts) != count:
            continue  # an incomplete upload
        parts.sort(key=lambda part: part.filename)
        files.append(
            HubFile(
                repo_id,
                parts[0].filename,
                sum(part.size for part in parts),
                None,
                revision=parts[0].revision,
                layout="shards",
                members=tuple(parts),
            )
        )
    return sorted(files, key=lambda file: (file.size, file.filename))


def mlx_folders(repo_id: str, *, token: str | None = None) -> list[HubFile]:
    """An MLX model repo as one folder to download (its weights, config and tokenizer)."""
    members = tuple(
        file for file in _repo_files(repo_id, token) if _MLX_MEMBER_PATTERN.search(file.filename)
    )
    if not any(member.filename.endswith(".safetensors") for member in members):
        return []
    name = repo_id.split("/")[-1]
    size = sum(member.size for member in members)
    revision = members[0].revision
    return [HubFile(repo_id, name, size, None, revision, layout="mlx-folder", members=members)]


def remote_model_info(file: HubFile, *, token: str | None = None) -> ModelInfo:
    """A model's metadata without its weights: a GGUF header, or an MLX folder's small files.

    A split model's is its first shard's (its parameter count too), with the whole size.
    A GGUF file's header is read with HTTP range requests: the first 2 MiB, then twice as
    much each time the header goes on, up to :data:`HEADER_MAX_READ`. Raises HubError (one
    line) for the network and the hub's refusals, ModelFileError for a file that is not a
    language model.
    """
    if file.is_folder:
        return _remote_mlx_info(file, token)
    if file.layout == "shards":  # the first shard holds the metadata and vocabulary
        return dataclasses.replace(
            remote_model_info(file.members[0], token=token), file_size=file.size
        )
    data = b""
    wanted = HEADER_FIRST_READ
    while True:
        data += _read_range(file, len(data), wanted, token)
        try:
            return model_info_from_header(data, file.hub_path, file.size)
        except HeaderNeedsMoreBytes:
            if len(data) < wanted or wanted >= HEADER_MAX_READ:
                raise HubError(
                    f"the header of {file.hub_path} is longer than "
                    f"{HEADER_MAX_READ >> 20} MiB or the file ends inside it"
                ) from None
            wanted *= 2


def _read_range(file: HubFile, start: int, end: int, token: str | None) -> bytes:
    """Bytes ``start`` to ``end`` (exclusive) of a file on the hub, by a range request.

    A server that answers with the whole file instead is refused before its body is read.
    """
    from huggingface_hub import get_session, hf_hub_url, hf_raise_for_status
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    url = hf_hub_url(file.repo_id, file.filename, revision=file.revision, endpoint=hub_endpoint())
    headers = {**build_hf_headers(token=token), "Range": f"bytes={start}-{end - 1}"}
    with (
        _one_line_errors(f"reading the header of {file.hub_path}"),
        get_session().stream(
            "GET", url, headers=headers, follow_redirects=True, timeout=TIMEOUT_SECONDS
        ) as response,
    ):
        hf_raise_for_status(response)
        if response.status_code != 206:
            raise HubError(
                f"reading the header of {file.hub_path}: the server sends whole files only "
                "(no range requests)"
            )
        return bytes(response.read())


def _remote_mlx_info(folder: HubFile, token: str | None) -> ModelInfo:
    """An MLX folder's ModelInfo from its config, tokenizer and safetensors headers.

    The small files are downloaded to a temporary folder; each weights file there is a
    sparse file of its real size holding only its header (read by range requests), so
    :func:`backends.models.mlx_info.read_mlx_model_info` reads it as it reads a folder here.
    """
    import struct
    import tempfile

    from backends.models.mlx_info import read_mlx_model_info

    with tempfile.TemporaryDirectory(prefix="specdeck-mlx-header-") as temporary:
        root = Path(temporary) / folder.filename
        for member in folder.members:
            target = root / member.filename
            if member.filename.endswith(".safetensors"):
                prefix = _read_range(member, 0, 8, token)
                (length,) = struct.unpack("<Q", prefix)
                if length > HEADER_MAX_READ:
                    raise HubError(f"the header of {member.hub_path} is too long")
                header = _read_range(member, 8, 8 + length, token)
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("wb") as stream:
                    stream.write(prefix + header)
                    stream.truncate(member.size)
            elif member.size <= HEADER_MAX_READ:
                download_to(member, target, token=token)
        info = read_mlx_model_info(root)
    return dataclasses.replace(info, path=folder.hub_path)


def cached_copy(file: HubFile) -> Path | None:
    """The file in the Hugging Face cache (used where it lies), if a whole copy is there.

    The cache keeps an LFS file under its SHA-256, so a copy whose name is another hash is
    not this file.
    """
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(file.repo_id, file.filename, revision=file.revision)
    if not isinstance(found, str):
        return None
    path = Path(found)
    if file.sha256 is not None and path.resolve().name != file.sha256:
        return None
    return path if path.is_file() and path.stat().st_size == file.size else None


def repo_download_dir(models_dir: Path, repo_id: str) -> Path:
    """Where a repo's GGUF files go in SpecDeck's models folder."""
    return models_dir / "hub" / repo_id.replace("/", "--")


def mlx_download_dir(models_dir: Path, repo_id: str) -> Path:
    """Where an MLX repo's folder goes: beside imported MLX folders, named with its owner."""
    return models_dir / MLX_FOLDER / repo_id.replace("/", "--")


def download(
    file: HubFile,
    models_dir: Path,
    *,
    progress: Callable[[int, int], None] | None = None,
    cancel: threading.Event | None = None,
    token: str | None = None,
) -> Path:
    """The model on this machine: the Hugging Face cache's copy, else downloaded.

    A file goes to :func:`repo_download_dir` (see :func:`download_to`); a split model's
    shards there too and an MLX folder to :func:`mlx_download_dir`, each of their files
    first into a hidden staging folder, moved into place once all have arrived. What is
    already there whole was checked when it arrived. Returns the file (a split model's
    first shard) or the MLX folder.
    """
    if file.layout == "file":
        cached = cached_copy(file)
        if cached is not None:
            logger.info("%s: using the Hugging Face cache's copy at %s", file.hub_path, cached)
            return cached
        target = repo_download_dir(models_dir, file.repo_id) / file.filename
        if not (target.is_file() and target.stat().st_size == file.size):
            download_to(file, target, progress=progress, cancel=cancel, token=token)
        return target
    if file.is_folder:
        folder = mlx_download_dir(models_dir, file.repo_id)
        _download_together(file, folder, progress, cancel, token)
        return folder
    folder = repo_download_dir(models_dir, file.repo_id)
    _download_together(file, folder, progress, cancel, token)
    return folder / file.filename


def partial_download(file: HubFile, models_dir: Path) -> bool:
    """Has a download of ``file`` begun and not ended (so that the next one resumes)?"""
    if file.layout == "file":
        target = repo_download_dir(models_dir, file.repo_id) / file.filename
        return target.with_name(target.name + PART_SUFFIX).exists()
    folder = (
        mlx_download_dir(models_dir, file.repo_id)
        if file.is_folder
        else repo_download_dir(models_dir, file.repo_id)
    )
    staging = _staging_folder(folder, file)
    return staging.is_dir() and any(staging.rglob("*"))


def _staging_folder(folder: Path, file: HubFile) -> Path:
    """The hidden folder where ``file``'s members wait (the catalog skips hidden folders)."""
    if file.is_folder:  # beside the MLX folders: <models>/mlx/.partial/<owner--name>
        return folder.parent / STAGING_FOLDER / folder.name
    return folder / STAGING_FOLDER / file.filename  # in the repo's: <repo>/.partial/<first>


def _download_together(
    file: HubFile,
    folder: Path,
    progress: Callable[[int, int], None] | None,
    cancel: threading.Event | None,
    token: str | None,
) -> None:
    """Every member of ``file`` into ``folder``, through its staging folder.

    Members move into place only once all have arrived, an MLX folder's config.json last
    (the catalog knows an MLX folder by it), so that no part of a model is ever listed.
    """
    if all(
        (folder / m.filename).is_file() and (folder / m.filename).stat().st_size == m.size
        for m in file.members
    ):
        return
    staging = _staging_folder(folder, file)
    done_before = 0
    for member in file.members:
        path = staging / member.filename
        if not (path.is_file() and path.stat().st_size == member.size):

            def member_progress(done: int, _total: int, base: int = done_before) -> None:
                if progress is not None:
                    progress(base + done, file.size)

            download_to(member, path, progress=member_progress, cancel=cancel, token=token)
        done_before += member.size
        if progress is not None:
            progress(done_before, file.size)
    for member in sorted(file.members, key=lambda m: m.filename == "config.json"):
        target = folder / member.filename
        target.parent.mkdir(parents=True, exist_ok=True)
        (staging / member.filename).replace(target)
    _remove_empty_folders(staging)


def _remove_empty_folders(folder: Path) -> None:
    """Remove ``folder`` and the empty folders under it (what staging leaves)."""
    for path in sorted(folder.rglob("*"), key=lambda p: -len(p.parts)):
        if path.is_dir():
            path.rmdir()
    folder.rmdir()
    if folder.parent.name == STAGING_FOLDER and not any(folder.parent.iterdir()):
        folder.parent.rmdir()


def download_to(
    file: HubFile,
    target: Path,
    *,
    progress: Callable[[int, int], None] | None = None,
    cancel: threading.Event | None = None,
    token: str | None = None,
) -> None:
    """Download ``file`` to ``target``, first as ``NAME.part`` (never listed as a model).

    ``progress(done, total)`` is called as bytes arrive; ``cancel`` set pauses it
    (DownloadPaused). What arrived stays, so the next call resumes from there, after a
    pause, a lost connection or a crash. The whole file is checked against the hub's
    SHA-256 before it takes its name; one that differs is deleted (HubError). A small
    file kept in git has no SHA-256 to check against: it is never resumed, always fetched
    whole.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    part = target.with_name(target.name + PART_SUFFIX)
    if part.exists() and (file.sha256 is None or part.stat().st_size > file.size):
        part.unlink()  # nothing to check it against, or not this file's start
    endpoint = hub_endpoint()
    url = hf_hub_url(file.repo_id, file.filename, revision=file.revision, endpoint=endpoint)
    with _one_line_errors(f"downloading {file.hub_path}"):
        target.parent.mkdir(parents=True, exist_ok=True)
        metadata = get_hf_file_metadata(url, token=token, timeout=TIMEOUT_SECONDS)
        if metadata.size is not None and metadata.size != file.size:
            raise HubError(
                f"the hub has {metadata.size:,} bytes for {file.hub_path}, not {file.size:,}"
            )
        # The hub's token goes to the hub only, not to the CDN it redirects to.
        location = metadata.location or url
        headers = build_hf_headers(token=token) if location.startswith(endpoint) else {}
        with part.open("ab") as stream:
            http_get(
                location,
                stream,
                resume_size=stream.tell(),
                headers=headers,
                expected_size=file.size,
                displayed_filename=file.filename,
                tqdm_class=_progress_class(progress, cancel),
            )
    if file.sha256 is not None:
        actual = file_sha256(part, cancel)
        if actual != file.sha256:
            part.unlink(missing_ok=True)
            raise HubError(
                f"{file.hub_path} arrived corrupt: its SHA-256 is {actual[:12]}…, the hub's "
                f"{file.sha256[:12]}… (deleted; download it again)"
            )
    part.replace(target)


def file_sha256(path: Path, cancel: threading.Event | None = None) -> str:
    """The SHA-256 of a file, read in chunks (DownloadPaused if ``cancel`` is set)."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(HASH_CHUNK):
            if cancel is not None and cancel.is_set():
                raise DownloadPaused(f"checking {path.name} was stopped")
            digest.update(chunk)
    return digest.hexdigest()


def _progress_class(
    progress: Callable[[int, int], None] | None, cancel: threading.Event | None
) -> type[Any]:
    """A tqdm class for the client's download that reports to ``progress`` and pauses."""
    from tqdm import tqdm

    base: type[tqdm[Any]] = tqdm  # generic in its type stubs only

    class _Progress(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True  # no terminal bar: ``progress`` says it
            super().__init__(*args, **kwargs)
            # A disabled bar counts nothing itself; a resumed download starts at ``initial``.
            self.done = int(kwargs.get("initial") or 0)

        def update(self, n: float | None = 1) -> bool | None:
            if cancel is not None and cancel.is_set():
                raise DownloadPaused("paused")
            self.done += int(n or 0)
            if progress is not None and self.total:
                progress(self.done, int(self.total))
            return None

    return _Progress


@contextmanager
def _one_line_errors(doing: str) -> Iterator[None]:
    """Turn the client's and the network's exceptions into one-line HubErrors."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except DownloadPaused as paused:
        raise DownloadPaused(f"{doing}: paused (resumes where it stopped)") from paused
    except GatedRepoError:
        raise HubError(
            f"{doing}: the repo is gated; accept its terms on the hub and log in "
            "(specdeck-models login, or a token in the Download dialog)"
        ) from None
    except RepositoryNotFoundError:
        raise HubError(f"{doing}: no such repo on the hub (or it is private: log in)") from None
    except RevisionNotFoundError:
        raise HubError(f"{doing}: the hub has no such revision") from None
    except OfflineModeIsEnabled:
        raise HubError(f"{doing}: HF_HUB_OFFLINE is set, so the hub is not asked") from None
    except LocalEntryNotFoundError as error:
        # The client says so when it could not reach the hub at all (an EntryNotFoundError
        # too, so it comes first).
        raise HubError(f"{doing}: cannot reach {hub_endpoint()} ({_cause(error)})") from None
    except EntryNotFoundError:
        raise HubError(f"{doing}: the repo has no such file") from None
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else "?"
        why = " (the token is missing or not accepted)" if status == 401 else ""
        raise HubError(f"{doing}: the hub answered HTTP {status}{why}") from None
    except OSError as error:
        if error.errno == errno.ENOSPC:
            where = f" ({error.filename})" if error.filename else ""
            raise HubError(f"{doing}: the disk is full{where}") from None
        raise HubError(f"{doing}: {_cause(error)}") from None
    except Exception as error:
        # httpx's connection, DNS and timeout errors (the client's own transport).
        name = type(error).__name__
        if "Timeout" in name:
            raise HubError(f"{doing}: the hub stopped answering (timed out)") from None
        if "Connect" in name or "Network" in name or "Protocol" in name or "Read" in name:
            raise HubError(f"{doing}: cannot reach {hub_endpoint()} ({_cause(error)})") from None
        raise


def _cause(error: BaseException) -> str:
    """The innermost reason of an error, in one line."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text[:200]
