"""Render assets/icons/specdeck.svg into the PNG sizes, .ico and .icns the platforms need.

Run from the repository root after changing the SVG: ``.venv/bin/python packaging/icons.py``.
The outputs are committed, so building a bundle needs no SVG renderer. Both containers hold
PNG images, which every supported Windows and macOS version reads.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ICONS = Path(__file__).resolve().parent.parent / "assets" / "icons"
SOURCE = ICONS / "specdeck.svg"
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
# .icns element types holding PNG data, by pixel size.
ICNS_TYPES = {16: b"icp4", 32: b"icp5", 64: b"icp6", 128: b"ic07", 256: b"ic08", 512: b"ic09"}


def render(renderer: QSvgRenderer, size: int) -> bytes:
    """The SVG as PNG bytes of ``size`` × ``size`` pixels."""
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(data.data())


def ico(images: dict[int, bytes]) -> bytes:
    """A Windows .ico holding PNG images (ICONDIR, ICONDIRENTRY × n, data)."""
    header = struct.pack("<HHH", 0, 1, len(images))
    offset = len(header) + 16 * len(images)
    entries, blobs = b"", b""
    for size, png in sorted(images.items()):
        edge = 0 if size >= 256 else size  # 0 means 256 in an ICONDIRENTRY
        entries += struct.pack("<BBBBHHII", edge, edge, 0, 0, 1, 32, len(png), offset)
        blobs += png
        offset += len(png)
    return header + entries + blobs


def icns(images: dict[int, bytes]) -> bytes:
    """A macOS .icns holding PNG images ('icns' header, then type + length + data each)."""
    body = b"".join(
        ICNS_TYPES[size] + struct.pack(">I", 8 + len(png)) + png
        for size, png in sorted(images.items())
    )
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def main() -> int:
    """Write every icon file next to the SVG."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    _app = QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(SOURCE))
    if not renderer.isValid():
        print(f"icons: cannot read {SOURCE}", file=sys.stderr)
        return 1
    pngs = {size: render(renderer, size) for size in PNG_SIZES}
    for size, png in pngs.items():
        (ICONS / f"specdeck-{size}.png").write_bytes(png)
    (ICONS / "specdeck.ico").write_bytes(ico({s: pngs[s] for s in ICO_SIZES}))
    (ICONS / "specdeck.icns").write_bytes(icns({s: pngs[s] for s in ICNS_TYPES}))
    print(f"icons: wrote {len(pngs)} PNG sizes, specdeck.ico and specdeck.icns in {ICONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
