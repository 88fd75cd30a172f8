"""llama.cpp's own tools, built from the llama.cpp inside the pinned llama-cpp-python sdist.

:mod:`benchmarks.vs_llama_cpp` runs them beside SpecDeck. The build is cached (like the
portable wheel) in ``~/.cache/specdeck/peer-llama.cpp/VERSION``: the sdist is fetched once
with pip, its ``vendor/llama.cpp`` configured with CMake (native CPU, release) and only
``llama-completion``, ``llama-speculative-simple`` and ``llama-server`` built (about 10
minutes on 2 cores; :mod:`benchmarks.vs_llama_server` runs the server).

On x86 the AMX kernels are compiled out (``-mno-amx-*``): llama.cpp would otherwise place
weights in the AMX buffer type, whose kernels crash on some Xeons (issue 12); SpecDeck
withholds that buffer type at run time instead. Everything else is llama.cpp's default,
weight repacking included.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

TOOLS = ("llama-completion", "llama-speculative-simple", "llama-server")
_NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
_BUILD_STAMP = "specdeck-build.txt"
_END_MARK = " [end of text]"


@dataclass(frozen=True)
class PeerTools:
    """Where the built tools are, and what they were built from."""

    completion: Path
    speculative: Path
    server: Path
    llama_cpp_python: str  # the sdist version whose llama.cpp they come from
    configuration: str  # the CMake options, for the report


def stock_release() -> str:
    """The installed llama-cpp-python's release (SpecDeck's build is VERSION+specdeck.N)."""
    return version("llama-cpp-python").split("+")[0]


def stock_library_folder() -> Path | None:
    """The stock llama.cpp shared libraries of a finished peer build (None: not built yet)."""
    folder = cache_root() / stock_release() / "build" / "bin"
    return folder if (folder / "libllama.so").exists() else None


def cache_root() -> Path:
    """Where builds are kept (``SPECDECK_PEER_CACHE`` overrides)."""
    override = os.environ.get("SPECDECK_PEER_CACHE")
    if override:
        return Path(override)
    return (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "specdeck"
        / "peer-llama.cpp"
    )


def cmake_options() -> list[str]:
    """The configuration: native release build of the tools, AMX compiled out on x86."""
    options = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DGGML_CCACHE=OFF",
    ]
    if platform.machine().lower() in ("x86_64", "amd64"):
        options += [f"-DCMAKE_C_FLAGS={_NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={_NO_AMX_FLAGS}"]
    return options


def _fetch_sources(release: str, into: Path) -> Path:
    """The sdist's ``vendor/llama.cpp``, unpacked under ``into`` (fetched with pip once)."""
    source = into / "src" / "llama.cpp"
    if (source / "CMakeLists.txt").exists():
        return source
    with tempfile.TemporaryDirectory(prefix="specdeck-sdist-") as folder:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={release}",
                "-d",
                folder,
            ],
            check=True,
        )
        archive = next(Path(folder).glob("llama_cpp_python-*.tar.gz"))
        prefix = f"{archive.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        staging = into / "src.partial"
        shutil.rmtree(staging, ignore_errors=True)
        with tarfile.open(archive) as bundle:
            members = [m for m in bundle.getmembers() if m.name.startswith(prefix)]
            for member in members:
                member.name = member.name.removeprefix(prefix)
            if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
                bundle.extractall(staging / "llama.cpp", members=members, filter="data")
            else:
                bundle.extractall(staging / "llama.cpp", members=members)
        shutil.rmtree(into / "src", ignore_errors=True)
        staging.rename(into / "src")
    return source


def build_tools(log: Callable[[str], None] = print) -> PeerTools:
    """The tools for the installed llama-cpp-python's version, built when not cached."""
    release = stock_release()
    root = cache_root() / release
    binaries = root / "build" / "bin"
    options = cmake_options()
    configuration = " ".join(options)
    stamp = root / _BUILD_STAMP
    built = all((binaries / tool).exists() for tool in TOOLS)
    if not (built and stamp.exists() and stamp.read_text(encoding="utf-8") == configuration):
        root.mkdir(parents=True, exist_ok=True)
        source = _fetch_sources(release, root)
        log(f"building {', '.join(TOOLS)} from llama-cpp-python {release}'s llama.cpp (minutes)")
        jobs = str(os.cpu_count() or 2)
        subprocess.run(
            ["cmake", "-S", str(source), "-B", str(root / "build"), *options],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            ["cmake", "--build", str(root / "build"), "-j", jobs, "--target", *TOOLS],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        stamp.write_text(configuration, encoding="utf-8")
    return PeerTools(
        completion=binaries / TOOLS[0],
        speculative=binaries / TOOLS[1],
        server=binaries / TOOLS[2],
        llama_cpp_python=release,
        configuration=configuration,
    )


@dataclass(frozen=True)
class PeerRun:
    """What one llama.cpp run reports about its generation."""

    text: str
    tokens: int
    tokens_per_second: float  # decoding only (after the prompt), as llama.cpp prints it
    drafted: int | None = None
    accepted: int | None = None
    draft_max: int | None = None

    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted (None without drafts)."""
        if not self.drafted or self.accepted is None:
            return None
        return self.accepted / self.drafted


_EVAL_LINE = re.compile(r"\beval time =\s*[\d.]+ ms /\s*(\d+) runs .*?([\d.]+) tokens per second")
_DECODED_LINE = re.compile(r"decoded\s+(\d+) tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s")


def _field(log: str, name: str) -> int | None:
    match = re.search(rf"\b{name}\s*=\s*(\d+)", log)
    return int(match.group(1)) if match else None


def _run(command: list[str], what: str) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(command, capture_output=True, timeout=1800)
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' | '.join(tail)}")
    return done


def common_arguments(
    model: Path, prompt_file: Path, max_tokens: int, threads: int, n_ctx: int
) -> list[str]:
    """Greedy decoding of ``prompt_file`` (already in the chat template) with ``threads``."""
    return [
        "-m",
        str(model),
        "-f",
        str(prompt_file),
        "-n",
        str(max_tokens),
        "--temp",
        "0",
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-c",
        str(n_ctx),
    ]


def run_completion(tools: PeerTools, common: list[str]) -> PeerRun:
    """Plain decoding with ``llama-completion``."""
    done = _run(
        [str(tools.completion), *common, "-no-cnv", "--no-display-prompt", "--perf"],
        "llama-completion",
    )
    log = done.stderr.decode(errors="replace")
    match = _EVAL_LINE.search(log)
    if match is None:
        raise RuntimeError("llama-completion printed no eval time")
    # It marks an end-of-generation token with a line of its own making.
    text = done.stdout.decode(errors="replace").rstrip().removesuffix(_END_MARK)
    return PeerRun(
        text=text,
        tokens=int(match.group(1)) + 1,  # the first token comes from the prompt's pass
        tokens_per_second=float(match.group(2)),
    )


def run_speculative(
    tools: PeerTools, common: list[str], spec_type: str, prompt_text: str, draft: Path | None = None
) -> PeerRun:
    """``llama-speculative-simple`` with ``--spec-type spec_type`` (and a draft model)."""
    extra = ["--spec-type", spec_type]
    if draft is not None:
        threads = common[common.index("-t") + 1]
        extra += ["-md", str(draft), "-td", threads, "-tbd", threads]
    done = _run([str(tools.speculative), *common, *extra], f"llama-speculative-simple {spec_type}")
    log = done.stderr.decode(errors="replace")
    match = _DECODED_LINE.search(log)
    if match is None:
        raise RuntimeError(f"llama-speculative-simple {spec_type} printed no decoding speed")
    text = done.stdout.decode(errors="replace")
    # It echoes the prompt (special tokens as text) after two newlines before the answer.
    start = text.find(prompt_text)
    if start >= 0:
        text = text[start + len(prompt_text) :]
    return PeerRun(
        text=text.rstrip("\n"),
        tokens=int(match.group(1)),
        tokens_per_second=float(match.group(2)),
        drafted=_field(log, "n_drafted"),
        accepted=_field(log, "n_accept"),
        draft_max=_field(log, "n_draft"),
    )


if __name__ == "__main__":
    built = build_tools()
    print(built.completion, built.speculative, sep="\n")
