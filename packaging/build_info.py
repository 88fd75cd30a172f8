"""Record what a bundle is built from: version, commit, date, llama.cpp backend (for About).

Writes packaging/build/build_info.json and packaging/build/VERSION; the spec bundles the JSON
and the app shows it in its About box. Run by the build scripts before PyInstaller.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "packaging" / "build"


def _git_commit() -> str:
    try:
        result = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return result.stdout.strip()


def main() -> int:
    """Write the build record."""
    import llama_cpp

    from backends.engines.hardware import llama_build_info

    build = llama_build_info()
    library_folder = Path(llama_cpp.__file__).parent / "lib"
    cpu_variants = sorted(
        path.name.removeprefix("libggml-cpu-").split(".")[0]
        for path in library_folder.glob("libggml-cpu-*")
    )
    info = {
        "version": version("specdeck"),
        "commit": _git_commit(),
        "built": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": sys.platform,
        "python": sys.version.split()[0],
        "llama_cpp_python": version("llama_cpp_python"),
        "llama_backend": build.backend,
        # Empty for a build tuned to the build machine's CPU (GGML_NATIVE).
        "llama_cpu_variants": ", ".join(dict.fromkeys(cpu_variants)),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "build_info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    (OUT / "VERSION").write_text(info["version"] + "\n", encoding="utf-8")
    print(f"build info: {info}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
