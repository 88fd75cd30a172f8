"""The About box: version, what the build contains, and where the data lives."""

from __future__ import annotations

import html
import json
import platform
import sys
from pathlib import Path

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import qVersion
from PySide6.QtWidgets import QMessageBox, QWidget

from backends.engines.weight_placement import WeightPlan, cpu_model_name, has_amx
from backends.paths import models_dir, user_data_dir
from gui.app_info import APP_NAME, app_version

BUILD_INFO_FILE = "build_info.json"


def build_info() -> dict[str, str]:
    """What packaging/build_info.py recorded in a bundle (empty when run from a checkout)."""
    base = Path(getattr(sys, "_MEIPASS", ""))
    if not getattr(sys, "frozen", False):
        return {}
    try:
        raw = json.loads((base / BUILD_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(key): str(value) for key, value in raw.items()}


def about_lines(
    engine_backend: str | None = None, weights: str | None = None
) -> list[tuple[str, str]]:
    """The About box's rows, label and value.

    ``weights``: what the loaded main model's report says of its weights; without a loaded
    model, what SpecDeck would choose on this CPU.
    """
    info = build_info()
    rows = [("Version", app_version())]
    if info:
        rows.append(("Build", f"{info.get('commit', '?')}, {info.get('built', '?')}"))
        variants = info.get("llama_cpu_variants")
        cpu = f", CPU variants chosen at run time: {variants}" if variants else ""
        rows.append(
            (
                "llama.cpp",
                f"llama-cpp-python {info.get('llama_cpp_python', '?')}, "
                f"{info.get('llama_backend', '?')} build{cpu}",
            )
        )
    else:
        rows.append(("Build", "development checkout"))
    if engine_backend:
        rows.append(("Engine backend", engine_backend))
    rows.append(("CPU", f"{cpu_model_name()}, {'with' if has_amx() else 'without'} AMX"))
    rows.append(("Weights", weights or WeightPlan.choose("auto").note))
    rows += [
        ("Qt", f"{qVersion()} (PySide6 {pyside_version})"),
        ("Python", f"{platform.python_version()} on {platform.system()} {platform.machine()}"),
        ("Data", str(user_data_dir())),
        ("Models", str(models_dir())),
    ]
    return rows


def show_about(
    parent: QWidget, engine_backend: str | None = None, weights: str | None = None
) -> None:
    """Open the About box."""
    rows = "".join(
        f"<tr><td><b>{html.escape(label)}</b>&nbsp;&nbsp;</td><td>{html.escape(value)}</td></tr>"
        for label, value in about_lines(engine_backend, weights)
    )
    QMessageBox.about(
        parent,
        f"About {APP_NAME}",
        f"<h3>{APP_NAME}</h3><p>Faster local LLM answers with speculative decoding, "
        f"and a window that shows how.</p><table>{rows}</table>",
    )
