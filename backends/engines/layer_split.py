"""The main model's layers split between workers and this computer: the setting, the placement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.errors import SettingsError

if TYPE_CHECKING:
    from collections.abc import Sequence


def parse_split(text: str | Sequence[float], n_workers: int) -> tuple[float, ...]:
    """A layer split: one share per worker and the last for this computer ("3,1,0").

    Empty means by free memory (returned as ``()``).
    """
    if isinstance(text, str):
        parts = [part for part in text.replace(",", " ").split() if part]
        try:
            shares = tuple(float(part) for part in parts)
        except ValueError:
            raise SettingsError(
                f"layer split {text!r}: give one number per worker and one for this computer"
            ) from None
    else:
        shares = tuple(float(share) for share in text)
    if not shares:
        return ()
    if n_workers == 0:
        raise SettingsError("a layer split needs workers to split across")
    if len(shares) != n_workers + 1:
        raise SettingsError(
            f"layer split has {len(shares)} shares; give {n_workers + 1}: one per worker "
            "and the last for this computer"
        )
    if any(share < 0 for share in shares) or sum(shares) <= 0:
        raise SettingsError("layer split: shares must be >= 0 and not all 0")
    return shares


@dataclass(frozen=True)
class LayerSplit:
    """How llama.cpp is told to place the main model: devices, their shares, layers off-CPU."""

    n_gpu_layers: int  # llama_model_params.n_gpu_layers (999: all, the output layer too)
    device_shares: tuple[float, ...]  # tensor_split, one per device in the devices list


def split_layers(
    n_layers: int,
    worker_shares: Sequence[float],
    local_gpu_shares: Sequence[float],
    local_cpu_share: float,
) -> LayerSplit:
    """Where the layers go: workers first, then this computer's GPUs, the rest on its CPU.

    llama.cpp counts the output layer as one more layer after the ``n_layers`` repeating
    ones: ``n_gpu_layers`` = k puts the output layer and the last k - 1 repeating layers on
    the devices (spread by their shares) and the rest on the CPU. With local GPUs the CPU
    keeps none; without, it keeps its share of the repeating layers (rounded; workers keep
    at least one each when their share is not 0).
    """
    shares = (*worker_shares, *local_gpu_shares)
    if local_gpu_shares or local_cpu_share <= 0:
        return LayerSplit(999, shares)
    total = sum(shares) + local_cpu_share
    remote = round(n_layers * sum(shares) / total) if total > 0 else 0
    remote = max(remote, sum(1 for share in shares if share > 0))
    return LayerSplit(min(remote, n_layers) + 1, shares)


__all__ = ["LayerSplit", "parse_split", "split_layers"]
