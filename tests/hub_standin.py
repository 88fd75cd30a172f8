"""A local stand-in for the Hugging Face Hub, for tests that run the real ``huggingface_hub``.

It serves, from repos declared in memory whose files are real local files, only the hub's own
routes, with the headers ``huggingface_hub`` (2.x, on httpx2) reads:

- ``GET /api/models`` (``list_models``: ``search``, ``filter``, ``author``, ``gated``, ``sort``,
  ``limit``, ``full``, ``expand``);
- ``GET /api/models/{repo_id}`` and ``.../revision/{revision}`` (``model_info``; ``blobs=true``,
  asked by ``files_metadata=True``, gives each sibling's ``size``, ``blobId`` and ``lfs``);
- ``GET /api/models/{repo_id}/tree/{revision}[/{path}]`` (``list_repo_tree``, and through it
  ``verify_repo_checksums``) and ``POST .../paths-info/{revision}`` (``get_paths_info``);
- ``HEAD``/``GET /{repo_id}/resolve/{revision}/{filename}`` (``hf_hub_download``,
  ``get_hf_file_metadata``, ``hf_hub_url``): a file kept in git answers 200 with its git blob id
  as ``ETag``; a file kept in LFS answers 302 to ``/cdn/{sha256}`` on a *second port* (another
  origin, as the hub's CDN is), with ``X-Linked-Etag`` (its quoted sha256) and ``X-Linked-Size``,
  so the client takes the metadata from the redirect and downloads from the CDN without its token;
- ``HEAD``/``GET /cdn/{sha256}`` on the CDN port;
- ``GET /api/whoami-v2`` (``whoami``, and ``login``, which checks a token with it): a token
  that some repo's ``access_tokens`` holds belongs to :data:`WHOAMI_USER`; others get 401.

Bodies honour ``Range: bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` (206 with ``Content-Range``;
416 past the end). Errors carry the hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``, ``GatedRepo``) and ``X-Error-Message``, which the client turns into its typed
errors. No response has an ``X-Xet-*`` header (nor tree entries a ``xetHash``), so the client
never takes its Xet path even with ``hf_xet`` installed: it downloads with plain HTTP GETs.

Use::

    repo = HubRepo("org/Model-GGUF", {"model.gguf": path, "README.md": readme})
    with serve_hub(repo) as hub:
        point_client_at(hub, tmp_path / "hf-home", monkeypatch)
        hf_hub_download("org/Model-GGUF", "model.gguf", endpoint=hub.endpoint)
        hub.cut_after_bytes = 1 << 20  # fault knobs: set between requests
        hub.requests()  # what the client asked for, in order

The server runs in a daemon thread with its own event loop; ``stop()`` (or leaving the ``with``)
wakes stalled bodies, closes both ports and joins the thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import socket
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from aiohttp import web

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping

    import pytest

# Suffixes that the hub's default .gitattributes sends to LFS (a subset: the ones models use).
LFS_SUFFIXES = frozenset(
    {".gguf", ".safetensors", ".bin", ".pt", ".pth", ".onnx", ".ckpt", ".h5", ".msgpack", ".npz"}
)
# The hub refuses files over 10 MB in plain git: anything larger is in LFS.
LFS_MIN_SIZE = 10 * 1024 * 1024
# Bytes read from disk and written per chunk of a file body.
BODY_CHUNK = 256 * 1024
# Seconds ``stop()`` allows for the loop to close connections before it gives up on it.
SHUTDOWN_SECONDS = 5.0
LFS_SPEC = "https://git-lfs.github.com/spec/v1"
WHOAMI_USER = "standin-user"  # who a valid token belongs to (``/api/whoami-v2``)
DEFAULT_LAST_MODIFIED = "2025-01-06T12:00:00.000Z"
# ``repo_id`` in a route: ``name`` or ``namespace/name``.
REPO_ID_PATTERN = r"[^/]+(?:/[^/]+)?"
GatedKind = Literal["auto", "manual"] | Literal[False]

BODY_BYTES = web.RequestKey("body_bytes", int)


@dataclass(frozen=True)
class HubRepo:
    """A model repo as the stand-in serves it.

    ``files`` maps each path in the repo (``"model.gguf"``, ``"sub/dir/a.json"``) to a real local
    file, read when served (its hashes are computed once, when the stand-in is made). A file is in
    LFS when ``lfs_paths`` names it, or, with ``lfs_paths`` left ``None``, when its suffix is in
    :data:`LFS_SUFFIXES` or it has at least :data:`LFS_MIN_SIZE` bytes.

    A ``gated`` repo's metadata is public, but its files answer 401 ``GatedRepo`` without a token
    and 403 with a token not in ``access_tokens``. A ``private`` repo is hidden (404
    ``RepoNotFound``, and left out of listings) from anyone without such a token. ``sha`` is the
    one commit every revision (``main`` or the sha itself) resolves to; by default the sha1 of
    the repo id. ``extra`` adds fields to the repo's model dict (``{"gguf": {...}}``).
    """

    repo_id: str
    files: Mapping[str, Path]
    tags: tuple[str, ...] = ("gguf",)
    gated: GatedKind = False
    private: bool = False
    access_tokens: frozenset[str] = frozenset()
    downloads: int = 0
    likes: int = 0
    library_name: str | None = "gguf"
    pipeline_tag: str | None = "text-generation"
    card_data: Mapping[str, Any] | None = None
    last_modified: str = DEFAULT_LAST_MODIFIED
    sha: str = ""
    lfs_paths: frozenset[str] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.sha:
            object.__setattr__(self, "sha", hashlib.sha1(self.repo_id.encode()).hexdigest())
        if not re.fullmatch(r"[0-9a-f]{40}", self.sha):
            raise ValueError(f"sha must be 40 lowercase hex digits, not {self.sha!r}")
        if not re.fullmatch(REPO_ID_PATTERN, self.repo_id):
            raise ValueError(f"not a repo id: {self.repo_id!r}")

    @property
    def author(self) -> str | None:
        return self.repo_id.split("/")[0] if "/" in self.repo_id else None

    def is_lfs(self, path_in_repo: str, size: int) -> bool:
        if self.lfs_paths is not None:
            return path_in_repo in self.lfs_paths
        return PurePosixPath(path_in_repo).suffix.lower() in LFS_SUFFIXES or size >= LFS_MIN_SIZE


@dataclass(frozen=True)
class HubBlob:
    """One file of a repo with the metadata the hub gives for it.

    ``blob_id`` is the git object id the hub reports (``blobId``, tree ``oid``, and the ``ETag``
    of the resolve route): that of the file's content when in git, of its LFS pointer when in LFS.
    """

    path_in_repo: str
    local_path: Path
    size: int
    sha256: str
    blob_id: str
    lfs: bool
    pointer_size: int

    @property
    def lfs_dict(self) -> dict[str, Any] | None:
        """``lfs`` as ``model_info`` gives it (None for a file in git)."""
        if not self.lfs:
            return None
        return {"sha256": self.sha256, "size": self.size, "pointerSize": self.pointer_size}


@dataclass(frozen=True)
class LoggedRequest:
    """One request the stand-in answered: ``site`` is ``"hub"`` or ``"cdn"``; ``path`` is as sent
    (percent-encoded, without the query); ``range`` is the ``Range`` header; ``token`` the bearer
    token sent, if any; ``body_bytes`` how many bytes of a file the body carried."""

    site: str
    method: str
    path: str
    query: str
    range: str | None
    token: str | None
    status: int
    body_bytes: int


class _UnsatisfiableRange(Exception):
    """A ``Range`` that starts past the end of the file (answered with 416)."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive ``(first, last)`` byte a ``Range`` header asks for, or None for the whole
    file (no header, or one this server ignores, like several ranges).

    Raises :class:`_UnsatisfiableRange` for a range that no byte of the file satisfies.
    """
    if header is None:
        return None
    match = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if match is None or (not match[1] and not match[2]):
        return None
    if not match[1]:  # bytes=-n: the last n bytes
        suffix = int(match[2])
        if suffix == 0 or size == 0:
            raise _UnsatisfiableRange
        return max(0, size - suffix), size - 1
    first = int(match[1])
    last = int(match[2]) if match[2] else size - 1
    if first >= size or last < first:
        raise _UnsatisfiableRange
    return first, min(last, size - 1)


_digest_lock = threading.Lock()
_digests: dict[tuple[str, int, int, bool], tuple[str, str | None]] = {}


def file_digests(path: Path, *, git_sha1: bool) -> tuple[str, str | None]:
    """``(sha256, git blob sha1 or None)`` of a file, hashed once per (path, size, mtime)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, git_sha1)
    with _digest_lock:
        known = _digests.get(key)
    if known is not None:
        return known
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(f"blob {stat.st_size}\0".encode()) if git_sha1 else None
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            sha256.update(chunk)
            if sha1 is not None:
                sha1.update(chunk)
    result = (sha256.hexdigest(), sha1.hexdigest() if sha1 is not None else None)
    with _digest_lock:
        _digests[key] = result
    return result


def git_blob_id(data: bytes) -> str:
    """The git object id of a blob with ``data`` (what the hub calls ``oid``/``blobId``)."""
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file git keeps in place of an LFS file."""
    return f"version {LFS_SPEC}\noid sha256:{sha256}\nsize {size}\n".encode()


def make_blob(repo: HubRepo, path_in_repo: str, local_path: Path) -> HubBlob:
    size = local_path.stat().st_size
    lfs = repo.is_lfs(path_in_repo, size)
    sha256, sha1 = file_digests(local_path, git_sha1=not lfs)
    if lfs:
        pointer = lfs_pointer(sha256, size)
        pointer_id = git_blob_id(pointer)
        return HubBlob(path_in_repo, local_path, size, sha256, pointer_id, True, len(pointer))
    assert sha1 is not None
    return HubBlob(path_in_repo, local_path, size, sha256, sha1, False, 0)


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in {"1", "true", "yes"}


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def hub_error(status: int, code: str | None, message: str, **headers: str) -> web.Response:
    """An error as the hub sends it: ``X-Error-Code``/``X-Error-Message`` and a JSON body."""
    all_headers = {"X-Error-Message": message, **headers}
    if code is not None:
        all_headers["X-Error-Code"] = code
    return web.json_response({"error": message}, status=status, headers=all_headers)


class HubStandin:
    """The stand-in server: its repos, its two origins, its request log and its fault knobs.

    Fault knobs (plain attributes; set them from the test between requests):

    ``cut_after_bytes``
        A file body (resolve or CDN GET) stops where the *file offset* reaches this number and
        the connection is closed before the promised ``Content-Length``: a whole-file GET gets
        exactly that many bytes, a resumed GET (``bytes=N-``) starting at or past it gets none.
        None: no cut.
    ``cut_times``
        How many more bodies to cut (decremented per cut); None cuts every one ("always").
    ``chunk_delay_seconds``
        File bodies wait this long after each chunk of :data:`BODY_CHUNK` bytes: a slow link,
        for tests that act in the middle of a download (0: none).
    ``stall_seconds``
        File bodies send their headers, then wait this long before their first byte (0: none).
        ``stop()`` wakes them.
    ``corrupt``
        File bodies carry the byte at ``corrupt_offset`` (None: the middle) inverted, while every
        piece of metadata keeps the true size and sha256.
    """

    def __init__(self, repos: Iterable[HubRepo], *, host: str = "127.0.0.1") -> None:
        self.host = host
        self.repos: dict[str, HubRepo] = {}
        self._blobs: dict[str, dict[str, HubBlob]] = {}
        self._by_sha256: dict[str, HubBlob] = {}
        for repo in repos:
            if repo.repo_id in self.repos:
                raise ValueError(f"repo declared twice: {repo.repo_id}")
            self.repos[repo.repo_id] = repo
            blobs = {p: make_blob(repo, p, Path(local)) for p, local in sorted(repo.files.items())}
            self._blobs[repo.repo_id] = blobs
            for blob in blobs.values():
                if blob.lfs:
                    self._by_sha256.setdefault(blob.sha256, blob)
        self.cut_after_bytes: int | None = None
        self.cut_times: int | None = None
        self.stall_seconds: float = 0.0
        self.chunk_delay_seconds: float = 0.0
        self.corrupt = False
        self.corrupt_offset: int | None = None
        self._log: list[LoggedRequest] = []
        self._log_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runners: list[web.AppRunner] = []
        self._stopping: asyncio.Event | None = None
        self._ports: dict[str, int] = {}

    # -- what tests read ----------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The hub's origin, e.g. ``http://127.0.0.1:PORT`` (for ``HF_ENDPOINT``/``endpoint=``)."""
        return f"http://{self.host}:{self._port('hub')}"

    @property
    def cdn_endpoint(self) -> str:
        """The CDN's origin (another port, so the client treats it as a foreign host)."""
        return f"http://{self.host}:{self._port('cdn')}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def blob(self, repo_id: str, path_in_repo: str) -> HubBlob:
        """The metadata the stand-in serves for a file."""
        return self._blobs[repo_id][path_in_repo]

    def resolve_url(self, repo_id: str, path_in_repo: str, revision: str = "main") -> str:
        return f"{self.endpoint}/{repo_id}/resolve/{quote(revision, safe='')}/{quote(path_in_repo)}"

    def requests(self) -> list[LoggedRequest]:
        """The requests answered so far, oldest first (a copy)."""
        with self._log_lock:
            return list(self._log)

    def file_gets(self) -> list[LoggedRequest]:
        """The GETs answered with file bytes (200 or 206 from resolve or the CDN), oldest first."""
        return [
            r
            for r in self.requests()
            if r.method == "GET"
            and r.status in (200, 206)
            and (r.site == "cdn" or "/resolve/" in r.path)
        ]

    def clear_log(self) -> None:
        with self._log_lock:
            self._log.clear()

    def reset_faults(self) -> None:
        self.cut_after_bytes = None
        self.cut_times = None
        self.stall_seconds = 0.0
        self.chunk_delay_seconds = 0.0
        self.corrupt = False
        self.corrupt_offset = None

    # -- start and stop -----------------------------------------------------------------------

    def start(self) -> HubStandin:
        if self._thread is not None:
            raise RuntimeError("the stand-in is already started")
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._start_sites())
        except BaseException:
            loop.run_until_complete(self._cleanup())
            loop.close()
            raise
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="hub-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            future = asyncio.run_coroutine_threadsafe(self._cleanup(), loop)
            future.result(timeout=SHUTDOWN_SECONDS + 5)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            if not thread.is_alive():
                loop.close()
            self._loop = None
            self._thread = None

    def __enter__(self) -> HubStandin:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _port(self, site: str) -> int:
        if site not in self._ports:
            raise RuntimeError("the stand-in is not started")
        return self._ports[site]

    async def _start_sites(self) -> None:
        self._stopping = asyncio.Event()
        for site, app in (("hub", self._hub_app()), ("cdn", self._cdn_app())):
            runner = web.AppRunner(
                app, handle_signals=False, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS
            )
            await runner.setup()
            self._runners.append(runner)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((self.host, 0))
            sock.listen(128)
            self._ports[site] = int(sock.getsockname()[1])
            await web.SockSite(runner, sock).start()

    async def _cleanup(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()

    # -- the apps -----------------------------------------------------------------------------

    def _logging_middleware(self, site: str) -> Any:
        @web.middleware
        async def log_request(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            request[BODY_BYTES] = 0
            status = 500
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as error:
                status = error.status
                raise
            finally:
                entry = LoggedRequest(
                    site=site,
                    method=request.method,
                    path=request.raw_path.partition("?")[0],
                    query=request.query_string,
                    range=request.headers.get("Range"),
                    token=_bearer(request),
                    status=status,
                    body_bytes=request[BODY_BYTES],
                )
                with self._log_lock:
                    self._log.append(entry)

        return log_request

    def _hub_app(self) -> web.Application:
        app = web.Application(middlewares=[self._logging_middleware("hub")])
        repo = f"{{repo_id:{REPO_ID_PATTERN}}}"
        app.router.add_get("/api/models", self._list_models)
        app.router.add_get("/api/whoami-v2", self._whoami)
        app.router.add_get(f"/api/models/{repo}/tree/{{revision}}", self._tree)
        app.router.add_get(f"/api/models/{repo}/tree/{{revision}}/{{path:.+}}", self._tree)
        app.router.add_post(f"/api/models/{repo}/paths-info/{{revision}}", self._paths_info)
        app.router.add_get(f"/api/models/{repo}/revision/{{revision}}", self._model_info)
        app.router.add_get(f"/api/models/{repo}", self._model_info)
        app.router.add_get(f"/{repo}/resolve/{{revision}}/{{filename:.+}}", self._resolve)
        return app

    def _cdn_app(self) -> web.Application:
        app = web.Application(middlewares=[self._logging_middleware("cdn")])
        app.router.add_get("/cdn/{sha256:[0-9a-f]{64}}", self._cdn)
        return app

    # -- access ---------------------------------------------------------------------------------

    def _find_repo(self, request: web.Request) -> HubRepo | web.Response:
        """The repo the route names, or the error the hub gives for it (missing or private)."""
        repo = self.repos.get(request.match_info["repo_id"])
        if repo is None or (repo.private and _bearer(request) not in repo.access_tokens):
            return hub_error(404, "RepoNotFound", "Repository not found")
        return repo

    def _check_revision(self, repo: HubRepo, revision: str) -> web.Response | None:
        if revision in ("main", repo.sha):
            return None
        return hub_error(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    @staticmethod
    def _check_gate(repo: HubRepo, request: web.Request) -> web.Response | None:
        """Files of a gated repo need a token with access (metadata does not)."""
        if not repo.gated:
            return None
        token = _bearer(request)
        if token is None:
            return hub_error(
                401,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted. You must have access to it and "
                "be authenticated to access it. Please log in.",
            )
        if token not in repo.access_tokens:
            return hub_error(
                403,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted and you are not in the "
                "authorized list.",
            )
        return None

    # -- metadata routes -----------------------------------------------------------------------

    def _model_dict(
        self, repo: HubRepo, *, siblings: Literal["names", "blobs"] | None, expand: list[str]
    ) -> dict[str, Any]:
        blobs = self._blobs[repo.repo_id].values()
        data: dict[str, Any] = {
            "_id": repo.sha[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.author,
            "sha": repo.sha,
            "lastModified": repo.last_modified,
            "createdAt": repo.last_modified,
            "private": repo.private,
            "gated": repo.gated,
            "disabled": False,
            "downloads": repo.downloads,
            "likes": repo.likes,
            "library_name": repo.library_name,
            "tags": list(repo.tags),
            "pipeline_tag": repo.pipeline_tag,
            "usedStorage": sum(blob.size for blob in blobs),
            **repo.extra,
        }
        if repo.card_data is not None:
            data["cardData"] = dict(repo.card_data)
        if "siblings" in expand and siblings is None:
            siblings = "names"
        if siblings == "names":
            data["siblings"] = [{"rfilename": blob.path_in_repo} for blob in blobs]
        elif siblings == "blobs":
            data["siblings"] = [
                {
                    "rfilename": blob.path_in_repo,
                    "size": blob.size,
                    "blobId": blob.blob_id,
                    **({"lfs": blob.lfs_dict} if blob.lfs else {}),
                }
                for blob in blobs
            ]
        if expand:  # the hub gives only the properties asked for
            data = {key: value for key, value in data.items() if key in {"_id", "id", *expand}}
        return data

    async def _whoami(self, request: web.Request) -> web.Response:
        """``whoami`` (and so ``login``): a token some repo accepts is a read token."""
        token = _bearer(request)
        if token is None or not any(token in repo.access_tokens for repo in self.repos.values()):
            return hub_error(401, None, "Invalid credentials in Authorization header")
        return web.json_response(
            {
                "type": "user",
                "name": WHOAMI_USER,
                "auth": {
                    "type": "access_token",
                    "accessToken": {"displayName": "standin", "role": "read"},
                },
            }
        )

    async def _list_models(self, request: web.Request) -> web.Response:
        query = request.query
        token = _bearer(request)
        search = query.get("search", "").lower()
        filters = query.getall("filter", [])
        author = query.get("author")
        gated = query.get("gated")
        found = [
            repo
            for repo in self.repos.values()
            if (not repo.private or token in repo.access_tokens)
            and search in repo.repo_id.lower()
            and all(tag in repo.tags for tag in filters)
            and (author is None or (repo.author or "").lower() == author.lower())
            and (gated is None or bool(repo.gated) == _truthy(gated))
        ]
        sort = query.get("sort")
        if sort in ("downloads", "likes"):
            found.sort(key=lambda repo: getattr(repo, sort), reverse=True)
        elif sort in ("lastModified", "createdAt"):
            found.sort(key=lambda repo: repo.last_modified, reverse=True)
        if "limit" in query:
            found = found[: int(query["limit"])]
        siblings: Literal["names"] | None = "names" if _truthy(query.get("full")) else None
        expand = query.getall("expand", [])
        return web.json_response(
            [self._model_dict(repo, siblings=siblings, expand=expand) for repo in found]
        )

    async def _model_info(self, request: web.Request) -> web.Response:
        repo = self._find_repo(request)
        if isinstance(repo, web.Response):
            return repo
        revision = request.match_info.get("revision", "main")
        if (error := self._check_revision(repo, revision)) is not None:
            return error
        siblings: Literal["names", "blobs"] = (
            "blobs" if _truthy(request.query.get("blobs")) else "names"
        )
        expand = request.query.getall("expand", [])
        return web.json_response(self._model_dict(repo, siblings=siblings, expand=expand))

    def _tree_entries(self, repo: HubRepo) -> dict[str, dict[str, Any]]:
        """Every file and folder of the repo as the tree routes give them, by path."""
        entries: dict[str, dict[str, Any]] = {}
        for blob in self._blobs[repo.repo_id].values():
            for parent in PurePosixPath(blob.path_in_repo).parents:
                folder = str(parent)
                if folder != "." and folder not in entries:
                    oid = hashlib.sha1(f"tree {repo.sha} {folder}".encode()).hexdigest()
                    entries[folder] = {"type": "directory", "oid": oid, "size": 0, "path": folder}
            entry: dict[str, Any] = {
                "type": "file",
                "oid": blob.blob_id,
                "size": blob.size,
                "path": blob.path_in_repo,
            }
            if blob.lfs:
                entry["lfs"] = {
                    "oid": blob.sha256,
                    "size": blob.size,
                    "pointerSize": blob.pointer_size,
                }
            entries[blob.path_in_repo] = entry
        return entries

    async def _tree(self, request: web.Request) -> web.Response:
        repo = self._find_repo(request)
        if isinstance(repo, web.Response):
            return repo
        if (error := self._check_revision(repo, request.match_info["revision"])) is not None:
            return error
        folder = request.match_info.get("path", "").strip("/")
        entries = self._tree_entries(repo)
        if folder and entries.get(folder, {}).get("type") != "directory":
            return hub_error(404, "EntryNotFound", f"{folder} does not exist on main")
        recursive = _truthy(request.query.get("recursive"))
        listed = [
            entry
            for path, entry in sorted(entries.items())
            if (PurePosixPath(path).parent == PurePosixPath(folder or "."))
            or (recursive and (not folder or path.startswith(folder + "/")))
        ]
        return web.json_response(listed)

    async def _paths_info(self, request: web.Request) -> web.Response:
        repo = self._find_repo(request)
        if isinstance(repo, web.Response):
            return repo
        if (error := self._check_revision(repo, request.match_info["revision"])) is not None:
            return error
        form = await request.post()
        entries = self._tree_entries(repo)
        paths = [str(path) for path in form.getall("paths", [])]
        return web.json_response([entries[path] for path in paths if path in entries])

    # -- file routes ---------------------------------------------------------------------------

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        repo = self._find_repo(request)
        if isinstance(repo, web.Response):
            return repo
        if (error := self._check_revision(repo, request.match_info["revision"])) is not None:
            return error
        if (error := self._check_gate(repo, request)) is not None:
            return error
        commit = {"X-Repo-Commit": repo.sha}
        blob = self._blobs[repo.repo_id].get(request.match_info["filename"])
        if blob is None:
            return hub_error(404, "EntryNotFound", "Entry not found", **commit)
        headers = {**commit, "ETag": f'"{blob.blob_id}"', "Accept-Ranges": "bytes"}
        if not blob.lfs:
            return await self._send_file(request, blob, headers)
        location = f"{self.cdn_endpoint}/cdn/{blob.sha256}"
        body = f"Found. Redirecting to {location}".encode()
        return web.Response(
            status=302,
            body=body,
            content_type="text/plain",
            headers={
                **headers,
                "Location": location,
                "X-Linked-Etag": f'"{blob.sha256}"',
                "X-Linked-Size": str(blob.size),
            },
        )

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        blob = self._by_sha256.get(request.match_info["sha256"])
        if blob is None:
            return web.Response(status=404, text="NoSuchKey")
        name = PurePosixPath(blob.path_in_repo).name
        headers = {
            "ETag": f'"{blob.sha256}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\"",
        }
        return await self._send_file(request, blob, headers)

    async def _send_file(
        self, request: web.Request, blob: HubBlob, headers: Mapping[str, str]
    ) -> web.StreamResponse:
        """Answer HEAD or GET with the file's bytes (or a range of them), applying the faults."""
        try:
            asked = parse_range(request.headers.get("Range"), blob.size)
        except _UnsatisfiableRange:
            return web.Response(
                status=416, headers={**headers, "Content-Range": f"bytes */{blob.size}"}
            )
        first, last = asked if asked is not None else (0, blob.size - 1)
        response = web.StreamResponse(status=200 if asked is None else 206, headers=headers)
        response.content_type = "application/octet-stream"
        response.content_length = last - first + 1
        if asked is not None:
            response.headers["Content-Range"] = f"bytes {first}-{last}/{blob.size}"
        await response.prepare(request)
        if request.method == "HEAD":
            await response.write_eof()
            return response

        if self.stall_seconds > 0 and await self._stalled(self.stall_seconds):
            self._close(request)
            return response
        end = last + 1
        cut = self.cut_after_bytes is not None and self.cut_after_bytes < end
        if cut and self.cut_times is not None:
            cut = self.cut_times > 0
            self.cut_times -= int(cut)
        if cut:
            assert self.cut_after_bytes is not None
            end = max(first, self.cut_after_bytes)
        flip_at = (
            (self.corrupt_offset if self.corrupt_offset is not None else blob.size // 2)
            if self.corrupt
            else -1
        )
        try:
            with blob.local_path.open("rb") as f:
                f.seek(first)
                offset = first
                while offset < end:
                    chunk = f.read(min(BODY_CHUNK, end - offset))
                    if not chunk:
                        break
                    if offset <= flip_at < offset + len(chunk):
                        data = bytearray(chunk)
                        data[flip_at - offset] ^= 0xFF
                        chunk = bytes(data)
                    await response.write(chunk)
                    offset += len(chunk)
                    request[BODY_BYTES] += len(chunk)
                    if self.chunk_delay_seconds > 0 and await self._stalled(
                        self.chunk_delay_seconds
                    ):
                        cut = True  # stopping: drop the connection
                        break
            if cut:
                self._close(request)
            else:
                await response.write_eof()
        except ConnectionError:  # the client went away (it timed out, or gave up)
            pass
        return response

    async def _stalled(self, seconds: float) -> bool:
        """Wait ``seconds``; True when the server began stopping meanwhile."""
        assert self._stopping is not None
        with suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        return self._stopping.is_set()

    @staticmethod
    def _close(request: web.Request) -> None:
        """Drop the connection mid-body: what is written goes out, then the socket closes."""
        if request.transport is not None:
            request.transport.close()


@contextmanager
def serve_hub(*repos: HubRepo, host: str = "127.0.0.1") -> Iterator[HubStandin]:
    """Run a :class:`HubStandin` for ``repos`` for the duration of the ``with``."""
    with HubStandin(repos, host=host) as standin:
        yield standin


# What ``huggingface_hub.constants.HUGGINGFACE_CO_URL_TEMPLATE`` adds to the endpoint.
RESOLVE_TEMPLATE = "/{repo_id}/resolve/{revision}/{filename}"
# Variables that would carry a real token, another home, or offline mode into the client.
_CLEARED_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_ASSETS_CACHE",
    "HF_XET_CACHE",
    "HF_OIDC_RESOURCE",
    "HF_OIDC_ID_TOKEN",
    "TRANSFORMERS_OFFLINE",
)


def point_client_at(standin: HubStandin, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point this process's ``huggingface_hub`` at ``standin``, with its home in ``home``.

    ``huggingface_hub`` reads ``HF_ENDPOINT``, ``HF_HOME`` and the rest once, when it is first
    imported, into ``huggingface_hub.constants``; setting the variables later changes nothing in
    this process. So this patches the constants the client reads at call time (the endpoint and
    the resolve URL template, the home, cache, token and registry paths, offline mode off,
    telemetry and implicit tokens off, so no real token is ever sent) and the endpoint of the
    module-level ``HfApi`` behind ``huggingface_hub.model_info`` & co. It also sets the variables,
    for subprocesses. Calls that pass ``endpoint=`` (``HfApi(endpoint=...)``,
    ``hf_hub_download(..., endpoint=...)``) need none of it but the isolation.
    """
    from huggingface_hub import constants, hf_api

    home.mkdir(parents=True, exist_ok=True)
    for name in _CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", standin.endpoint)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")

    patched: dict[str, object] = {
        "ENDPOINT": standin.endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": f"{standin.endpoint}{RESOLVE_TEMPLATE}",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HUGGINGFACE_HUB_CACHE": str(home / "hub"),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HUGGINGFACE_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "CHECK_FOR_UPDATE_DONE_PATH": str(home / ".check_for_update_done"),
        "CHECK_FOR_SKILL_UPDATE_DONE_PATH": str(home / ".check_for_skill_update_done"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": True,
    }
    for name, value in patched.items():
        if hasattr(constants, name):
            monkeypatch.setattr(constants, name, value)
    monkeypatch.setattr(hf_api.api, "endpoint", standin.endpoint)


class RecordedSleeps:
    """Stands in for the ``time`` module of ``huggingface_hub.file_download``: the pause before
    each resume attempt (1 s in 2.4.0) returns at once and is recorded; the rest is ``time``'s."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.calls.append(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def instant_client_retries(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Make ``hf_hub_download``'s retries of a broken body immediate; returns the pauses skipped.

    ``http_get`` retries a body that fails (connection lost, read timeout) up to 5 times, after
    ``time.sleep(1)`` each: without this a test of a failing download takes over 5 s.
    """
    from huggingface_hub import file_download

    sleeps = RecordedSleeps()
    monkeypatch.setattr(file_download, "time", sleeps)
    return sleeps.calls
