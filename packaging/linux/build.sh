#!/usr/bin/env bash
# Build the Linux bundle (dist/SpecDeck/, PyInstaller onedir) and a .deb around it
# (dist/specdeck_<version>_<arch>.deb): the app in /opt/specdeck, a launcher in /usr/bin,
# the .desktop file and the icons under hicolor. Run from a set-up checkout (scripts/setup).
# A library PyInstaller cannot find is a broken bundle: the build fails on the warning.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=build/bundle-venv/bin/python

# A bundle runs on other people's CPUs: llama.cpp is built with every x86 CPU variant,
# chosen at run time (GGML_CPU_ALL_VARIANTS), not for this machine's CPU (the build that
# scripts/setup installs would die with SIGILL on a CPU without AVX-512), with the Vulkan
# and RPC backends and SpecDeck's llama.cpp patches as in scripts/setup. The wheel is built
# once (~25 min on 2 cores) and kept in the cache.
cache=${XDG_CACHE_HOME:-$HOME/.cache}/specdeck
wheels=${SPECDECK_WHEEL_CACHE:-$cache/portable-wheels}
echo "bundle: a portable llama-cpp-python with SpecDeck's patches (all CPU variants; built once)"
wheel=$(CMAKE_ARGS=$(packaging/llama.cpp/cmake-args portable "$cache") \
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)} \
    packaging/llama.cpp/build-wheel .venv/bin/python "$wheels")
# The bundle's own environment: SpecDeck (not editable, so its metadata travels) and its
# runtime dependencies only; no test tools, no MLX.
[ -x "$python" ] || python3 -m venv build/bundle-venv
"$python" -m pip install --quiet --upgrade pip
# The backends (CPU variants, Vulkan, RPC) beside libggml, one file per library.
packaging/llama.cpp/install-wheel "$python" "$wheel"
"$python" -m pip install --quiet . 'pyinstaller>=6.10'
"$python" packaging/build_info.py >/dev/null
version=$(cat packaging/build/VERSION)
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)

echo "bundle: PyInstaller onedir (SpecDeck $version)"
mkdir -p build
rm -rf dist/SpecDeck build/pyinstaller
if ! "$python" -m PyInstaller --noconfirm --clean --log-level WARN \
        --distpath dist --workpath build/pyinstaller packaging/specdeck.spec \
        >build/pyinstaller.log 2>&1; then
    tail -30 build/pyinstaller.log >&2
    echo "bundle: PyInstaller failed (log: build/pyinstaller.log)" >&2
    exit 1
fi
# The GTK platform theme plugin links the desktop's own GTK 3 (native dialogs on GNOME); it
# is meant to come from the system, not the bundle (the .deb recommends libgtk-3-0).
if grep -E "Library not found|lib not found" build/pyinstaller.log \
        | grep -v "platformthemes/libqgtk3.so" >&2; then
    echo "bundle: libraries are missing from the build machine (above); install them" >&2
    exit 1
fi
test -x dist/SpecDeck/specdeck

echo "bundle: .deb"
root=build/deb/specdeck
rm -rf build/deb
mkdir -p "$root/DEBIAN" "$root/opt" "$root/usr/bin" "$root/usr/share/applications"
cp -a dist/SpecDeck "$root/opt/specdeck"
ln -s /opt/specdeck/specdeck "$root/usr/bin/specdeck"
install -m 644 assets/specdeck.desktop "$root/usr/share/applications/specdeck.desktop"
for size in 16 24 32 48 64 128 256 512; do
    folder="$root/usr/share/icons/hicolor/${size}x${size}/apps"
    mkdir -p "$folder"
    install -m 644 "assets/icons/specdeck-$size.png" "$folder/specdeck.png"
done
mkdir -p "$root/usr/share/icons/hicolor/scalable/apps"
install -m 644 assets/icons/specdeck.svg "$root/usr/share/icons/hicolor/scalable/apps/specdeck.svg"
installed_kb=$(du -sk "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: specdeck
Version: $version
Architecture: $arch
Maintainer: SpecDeck developers <specdeck@users.noreply.github.com>
Installed-Size: $installed_kb
Section: devel
Priority: optional
Recommends: libgtk-3-0, libvulkan1
Depends: libc6, libegl1, libgl1, libfontconfig1, libfreetype6, libdbus-1-3, libxkbcommon0, libxkbcommon-x11-0, libxcb-cursor0, libxcb-icccm4, libxcb-keysyms1, libxcb-image0, libxcb-render-util0, libxcb-shape0, libxcb-randr0, libxcb-xinerama0, libxcb-xkb1
Description: Faster local LLM answers with speculative decoding
 A desktop app that runs local GGUF models with llama.cpp (CPU and Vulkan) and
 speculative decoding: a draft model or an n-gram lookup guesses tokens, the
 main model verifies them, and the window shows which tokens were accepted,
 the live acceptance rate and the speedup over the main model alone.
CONTROL
cat >"$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q /usr/share/applications || true
command -v gtk-update-icon-cache >/dev/null 2>&1 && gtk-update-icon-cache -q -t /usr/share/icons/hicolor || true
POSTINST
cp "$root/DEBIAN/postinst" "$root/DEBIAN/postrm"
chmod 755 "$root/DEBIAN/postinst" "$root/DEBIAN/postrm"
deb="dist/specdeck_${version}_${arch}.deb"
# zstd: as small as xz within a few percent, compressed in seconds instead of minutes.
dpkg-deb --build --root-owner-group -Zzstd "$root" "$deb" >/dev/null
echo "bundle: $(du -sh dist/SpecDeck | cut -f1) in dist/SpecDeck, $(du -h "$deb" | cut -f1) $deb"
