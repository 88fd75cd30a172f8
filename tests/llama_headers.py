"""The C headers installed with the built llama-cpp-python, read for the values SpecDeck copies.

``packaging/llama.cpp/build-wheel`` builds llama.cpp with ``cmake --install``, which puts
``llama.h``, ``ggml.h``, ``ggml-rpc.h`` and the rest in ``include/`` beside the ``llama_cpp``
package: the very sources the installed libraries were compiled from.
"""

from __future__ import annotations

import re
from pathlib import Path

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def include_folder() -> Path:
    """The installed llama-cpp-python's ``include/`` folder."""
    import llama_cpp

    folder = Path(llama_cpp.__file__).resolve().parent.parent / "include"
    if not (folder / "llama.h").is_file():
        raise FileNotFoundError(
            f"no llama.h in {folder}: llama-cpp-python was not built by scripts/setup"
        )
    return folder


def header(name: str) -> str:
    """The text of an installed header, e.g. ``header("ggml.h")``."""
    return (include_folder() / name).read_text(encoding="utf-8")


def enum_values(text: str, enum: str) -> dict[str, int]:
    """The enumerators of ``enum NAME { ... }`` in a header, with C's implicit values."""
    found = re.search(rf"\benum\s+{re.escape(enum)}\s*\{{(.*?)\}}", text, re.DOTALL)
    if found is None:
        raise LookupError(f"no enum {enum} in the header")
    values: dict[str, int] = {}
    following = 0
    for entry in _COMMENT.sub("", found.group(1)).split(","):
        name, _, value = (part.strip() for part in entry.partition("="))
        if not name:
            continue
        if value:  # a number, or an enumerator before it
            following = values[value] if value in values else int(value, 0)
        values[name] = following
        following += 1
    return values


def define_value(text: str, name: str) -> int:
    """The integer a ``#define NAME VALUE`` in a header gives."""
    found = re.search(rf"^\s*#\s*define\s+{re.escape(name)}\s+(\S+)", text, re.MULTILINE)
    if found is None:
        raise LookupError(f"no #define {name} in the header")
    return int(found.group(1), 0)
