"""The status bar: memory of the app and its engine, free memory, workers, what a pair needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import psutil
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from backends.engines.hardware import (
    available_memory,
    estimate_model_memory,
    estimate_pair_memory,
)
from backends.engines.interface import LOCAL_CPU_PLACE
from gui.theme import keep_styled, text_colour

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.models.gguf_info import ModelInfo
    from backends.service.protocol import WorkerReport
    from gui.engine_client import PairReport

RESOURCE_REFRESH_MS = 2000
# Above this share of the available memory a load is risky: warn before the machine swaps.
TIGHT_MEMORY_SHARE = 0.8
GIB = 2**30
MIB = 2**20


def format_bytes(size: float) -> str:
    """1.3 GB, 240 MB."""
    if size >= GIB:
        return f"{size / GIB:.1f} GB"
    return f"{size / MIB:.0f} MB"


def process_memory(pid: int | None) -> int | None:
    """Resident memory of a process (None when it is gone or unknown)."""
    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):
        return None


def gpu_summary(pair: PairReport) -> str:
    """Where the layers went, and the GPU memory left where the backend reports it."""
    main = pair.main
    if main.layer_placement:
        workers = sum(1 for where, _count in main.layer_placement if where.startswith("worker "))
        here = dict(main.layer_placement).get(LOCAL_CPU_PLACE, 0)
        text = f"Main model on {workers} worker{'s' if workers != 1 else ''}"
        text += f" and {here} layers here" if here else ""
        return text + (", draft here" if pair.draft is not None else "")
    if main.gpu_layers <= 0:
        return f"{main.backend} build: no GPU offload"
    text = f"{main.backend}: main {main.gpu_layers}/{main.n_layers} layers on GPU"
    if pair.draft is not None and pair.draft.gpu_layers >= pair.draft.n_layers:
        text += ", draft all layers on GPU"
    for gpu in pair.gpus:
        if gpu.memory_free is not None and gpu.memory_total is not None:
            free, total = format_bytes(gpu.memory_free), format_bytes(gpu.memory_total)
            text += f" · {gpu.description or gpu.name}: {free} free of {total}"
    return text


class ResourceStatusBar(QStatusBar):
    """Shows the app's and the engine's memory, free memory, the GPU, and the pair estimate."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._engine_pid: int | None = None
        self._gpu = "GPU: none loaded"
        self.memory_label = QLabel()
        self.gpu_label = QLabel()
        self.estimate_label = QLabel()
        self.workers_label = QLabel()
        self.workers_label.setObjectName("workersStatus")
        self.workers_label.hide()
        for label in (self.estimate_label, self.workers_label, self.gpu_label, self.memory_label):
            label.setContentsMargins(8, 0, 8, 0)
            self.addPermanentWidget(label)
        self._timer = QTimer(self)
        self._timer.setInterval(RESOURCE_REFRESH_MS)
        self._timer.timeout.connect(self._update_memory)
        self._timer.start()
        self._update_memory()
        self._update_gpu()

    def set_engine_pid(self, pid: int | None) -> None:
        """Follow the engine process (None: not running)."""
        self._engine_pid = pid
        self._update_memory()

    def set_gpu(self, text: str) -> None:
        """What the loaded models run on ("CPU build: no GPU", "CUDA: all 28 layers on GPU")."""
        self._gpu = text
        self._update_gpu()

    def set_workers(self, reports: Sequence[WorkerReport]) -> None:
        """Each worker of the main model: reachable or not, its layers and memory."""
        if not reports:
            self.workers_label.clear()
            self.workers_label.hide()
            return
        lost = [report for report in reports if not report.reachable]
        text = "Workers: " + " · ".join(_worker_text(report) for report in reports)
        self.workers_label.setText(text)
        keep_styled(
            self.workers_label,
            text_colour("bad" if lost else "muted_text"),
        )
        self.workers_label.setToolTip(
            "\n".join(report.summary() for report in reports)
            + "\nllama.cpp RPC workers hold these layers of the main model; the draft is here."
        )
        self.workers_label.show()

    def set_pair_estimate(
        self, main: ModelInfo | None, draft: ModelInfo | None, n_ctx: int, workers: int = 0
    ) -> None:
        """Before loading: what the chosen pair needs against what is free, warned in colour.

        With ``workers`` the main model's layers are mostly theirs: the draft is what must
        fit here.
        """
        if main is None:
            self.estimate_label.clear()
            self.estimate_label.setToolTip("")
            return
        free = available_memory()
        if workers:
            needed = estimate_model_memory(draft, n_ctx) if draft is not None else 0
            self.estimate_label.setText(
                f"Main model on {workers} worker{'s' if workers != 1 else ''} · draft needs "
                f"≈{format_bytes(needed)} of {format_bytes(free)} free here"
            )
            keep_styled(
                self.estimate_label,
                text_colour("bad" if needed > free else "muted_text"),
            )
            self.estimate_label.setToolTip(
                "The main model's layers are split over the workers (and this computer, by "
                "the Layer split); the draft runs here."
            )
            return
        needed = estimate_pair_memory(main, draft, n_ctx)
        text = f"Pair needs ≈{format_bytes(needed)} of {format_bytes(free)} free"
        colour = "muted_text"
        tip = "Estimated from the files' sizes and the KV cache of the chosen context size."
        if needed > free:
            text = (
                f"Not enough memory: pair needs ≈{format_bytes(needed)}, {format_bytes(free)} free"
            )
            colour = "bad"
            tip += " Loading would swap or fail: choose smaller models or a smaller context."
        elif needed > TIGHT_MEMORY_SHARE * free:
            text += " (tight)"
            colour = "warn"
            tip += " Close other programs before loading."
        self.estimate_label.setText(text)
        keep_styled(self.estimate_label, text_colour(colour))
        self.estimate_label.setToolTip(tip)

    def _update_memory(self) -> None:
        app = process_memory(psutil.Process().pid) or 0
        parts = [f"App {format_bytes(app)}"]
        engine = process_memory(self._engine_pid)
        if engine is not None:
            parts.append(f"Engine {format_bytes(engine)}")
        parts.append(f"Free {format_bytes(available_memory())}")
        self.memory_label.setText(" · ".join(parts))

    def _update_gpu(self) -> None:
        self.gpu_label.setText(self._gpu)


def _worker_text(report: WorkerReport) -> str:
    if not report.reachable:
        return f"{report.address} ✗ {report.problem}"
    return f"{report.address} ✓ {report.layers} layers, {format_bytes(report.memory_free)} free"
