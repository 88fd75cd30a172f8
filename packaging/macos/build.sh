#!/usr/bin/env bash
# Build SpecDeck.app and a .dmg on macOS (Apple Silicon: llama.cpp with Metal, and MLX).
# Not run by CI (no macOS here); written against PyInstaller's documented BUNDLE step.
#   packaging/macos/build.sh        → dist/SpecDeck.app, dist/SpecDeck-<version>.dmg
# SPECDECK_CODESIGN_IDENTITY="Developer ID Application: …" signs for distribution (then
# notarize with `xcrun notarytool submit dist/SpecDeck-<version>.dmg --wait`); without it
# the app is signed ad hoc, which runs on the build Mac and after "Open" on others.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# llama-cpp-python builds with Metal by default on macOS; MLX comes from PyPI's arm64 wheels.
# With llama.cpp's RPC backend (`specdeck worker`, Workers).
export CMAKE_ARGS="-DGGML_RPC=ON -DGGML_RPC_RDMA=OFF${CMAKE_ARGS:+ $CMAKE_ARGS}"
.venv/bin/python -m pip install --quiet -e '.[dev]' 'pyinstaller>=6.10'
.venv/bin/python packaging/build_info.py >/dev/null
version=$(cat packaging/build/VERSION)
rm -rf dist/SpecDeck dist/SpecDeck.app build/pyinstaller
.venv/bin/python -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath dist --workpath build/pyinstaller packaging/specdeck.spec
app=dist/SpecDeck.app
# MLX finds its Metal kernels next to libmlx; a bundle without them fails at the first op.
find "$app" -name 'mlx.metallib' | grep -q . || { echo "mlx.metallib missing from $app" >&2; exit 1; }
codesign --force --deep --options runtime --sign "${SPECDECK_CODESIGN_IDENTITY:--}" "$app"
"$app/Contents/MacOS/specdeck" --self-test
dmg="dist/SpecDeck-$version.dmg"
rm -f "$dmg"
staging=$(mktemp -d)
cp -R "$app" "$staging/"
ln -s /Applications "$staging/Applications"
hdiutil create -volname "SpecDeck $version" -srcfolder "$staging" -ov -format UDZO "$dmg"
rm -rf "$staging"
echo "bundle: $app and $dmg"
