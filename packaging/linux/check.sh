#!/usr/bin/env bash
# Install the built .deb, check it as a user would get it, remove it again (needs root):
# the .desktop file validates, the icons are in place, the installed app prints its version
# and passes --self-test (the real window offscreen, a small model pair, one answer with
# speculation), and removing the package leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/../.."
deb=$(ls -t dist/specdeck_*.deb | head -1)
models=$(mktemp -d)
trap 'rm -rf "$models"' EXIT

if command -v apt-get >/dev/null 2>&1 && ! command -v desktop-file-validate >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq desktop-file-utils >/dev/null
fi
echo "check: installing $deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "./$deb" >/dev/null
desktop-file-validate /usr/share/applications/specdeck.desktop
test -f /usr/share/icons/hicolor/256x256/apps/specdeck.png
test -f /usr/share/icons/hicolor/scalable/apps/specdeck.svg
test "$(command -v specdeck)" = /usr/bin/specdeck
/usr/bin/specdeck --version
# From an empty folder and a clean environment: nothing may come from the checkout's venv.
# The installed app fetches the small model itself (its bundled pip, SHA-256 verified), as
# the first-run dialog does, then answers with it.
run_installed() {
    (cd / && env -i HOME="$HOME" PATH=/usr/bin:/bin LANG=C.UTF-8 QT_QPA_PLATFORM=offscreen \
        SPECDECK_MODELS_DIR="$models" "$@")
}
run_installed /usr/bin/specdeck --models fetch smollm2-135m-instruct-q4_1
run_installed /usr/bin/specdeck --self-test
echo "check: removing"
DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq specdeck >/dev/null
test ! -e /opt/specdeck && test ! -e /usr/bin/specdeck
echo "check: the .deb installs, validates, passes its self-test and removes cleanly"
