"""The soak benchmark's machinery: a short run serves every kind it can and draws its curve."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from benchmarks.soak import _slope

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_the_slope_is_the_least_squares_fit() -> None:
    assert _slope([(0.0, 100.0), (10.0, 101.0), (20.0, 102.0)]) == pytest.approx(0.1)
    assert _slope([(0.0, 100.0), (10.0, 100.0)]) == 0.0
    assert _slope([(5.0, 100.0)]) == 0.0


@pytest.mark.heavy
def test_a_short_soak_serves_reports_memory_and_draws_the_curve(
    smollm_path: Path, tmp_path: Path
) -> None:
    png = tmp_path / "soak.png"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--minutes", "0.1", "--clients", "3"]
        + ["--max-tokens", "4", "--main", str(smollm_path), "--png", str(png), "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["wrong"] == []
    assert report["still_answers"] is True
    assert report["served"] > 0
    assert len(report["by_kind"]) >= 2
    assert len(report["samples"]) >= 2
    memory = report["rss_mb"]
    assert 50 < memory["after_warm_up"] <= memory["highest"]
    assert memory["at_end"] <= memory["highest"]
    image = QImage(str(png))
    assert (image.width(), image.height()) == (900, 420)
