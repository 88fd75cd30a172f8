#!/usr/bin/env bash
# Install the built .deb, check it as a user would get it, remove it again (needs root):
# the .desktop file validates, the icons are in place, the installed app prints its version
# and passes --self-test (the real window offscreen, a small model pair, one answer with
# speculation), and removing the package leaves nothing behind. On a CPU with AMX the
# self-test runs twice: with the CPU library llama.cpp picks for it (Sapphire Rapids, whose
# AMX kernels SpecDeck must keep out of use) and with the Zen 4 one, as on a CPU without AMX.
# Then the bundle's llama.cpp build is checked for bit-exact verification batches.
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
echo "check: the hub client is bundled (no hub here: one line, exit 1)"
hub_log=$(mktemp)
if run_installed env HF_ENDPOINT=http://127.0.0.1:9 /usr/bin/specdeck --models search qwen \
    >"$hub_log" 2>&1; then
    echo "check: a search of an unreachable hub succeeded" >&2; exit 1
fi
grep -q "^specdeck-models: error: searching the hub for 'qwen': cannot reach" "$hub_log" || {
    cat "$hub_log" >&2; exit 1; }
cpu=$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo | head -n 1)
if grep -qw amx_tile /proc/cpuinfo; then amx=yes; else amx=no; fi
echo "check: self-test on ${cpu:-an unknown CPU} (AMX: $amx)"
log=$(mktemp)
run_installed /usr/bin/specdeck --self-test 2>&1 | tee "$log"
grep -q "^self-test: ok" "$log"
if [ "$amx" = yes ]; then
    grep -q "Main: CPU (sapphirerapids)" "$log"
    grep -q "AMX withheld: llama.cpp's AMX kernels crash on this CPU" "$log"
    echo "check: self-test with the Zen 4 CPU library (no AMX kernels)"
    run_installed SPECDECK_CPU_VARIANT=zen4 /usr/bin/specdeck --self-test 2>&1 | tee "$log"
    grep -q "^self-test: ok" "$log"
    grep -q "Main: CPU (zen4)" "$log"
fi
# Without a Vulkan GPU (this machine's lavapipe is a CPU device, which llama.cpp leaves out
# unless GGML_VK_VISIBLE_DEVICES names it; here every Vulkan driver is hidden too) the app
# runs on the CPU; with lavapipe named, both models go onto it and are verified exactly.
if [ -e /opt/specdeck/_internal/llama_cpp/lib/libggml-vulkan.so ]; then
    echo "check: self-test with Vulkan hidden (the CPU)"
    run_installed VK_DRIVER_FILES=/nonexistent.json VK_ICD_FILENAMES=/nonexistent.json \
        /usr/bin/specdeck --self-test 2>&1 | tee "$log"
    grep -q "^self-test: ok: .*Main: CPU[^;]*: all [0-9]* layers on CPU" "$log"
    icd=$(ls /usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null | head -1 || true)
    if [ -n "$icd" ]; then
        echo "check: self-test on lavapipe (Mesa's Vulkan device on the CPU)"
        run_installed VK_DRIVER_FILES="$icd" VK_ICD_FILENAMES="$icd" GGML_VK_VISIBLE_DEVICES=0 \
            /usr/bin/specdeck --self-test 2>&1 | tee "$log"
        grep -q "^self-test: ok: .*Main: Vulkan: all [0-9]* layers on GPU (Vulkan0: llvmpipe)" "$log"
        grep -q "Draft: Vulkan: all [0-9]* layers on GPU (Vulkan0: llvmpipe)" "$log"
    fi
else
    echo "check: the bundle has no Vulkan backend (its build machine lacked the tools)" >&2
    exit 1
fi
# A native crash of the installed engine while loading: one line, exit 1, within seconds.
echo "check: self-test with the engine made to crash while loading"
started=$(date +%s)
if run_installed SPECDECK_CRASH_AT=main-probe /usr/bin/specdeck --self-test >"$log" 2>&1; then
    echo "check: the self-test passed although its engine crashed" >&2
    exit 1
fi
tail -n 1 "$log"
grep -q "^self-test: FAILED: the models did not load: .*SIGSEGV: Segmentation fault" "$log"
test $(($(date +%s) - started)) -lt 60
# The installed app serves the OpenAI-compatible API (aiohttp is in the bundle): a chat
# answer over HTTP from the small model, then a clean stop.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# serve_and_ask ARGS...: the installed app's `specdeck serve ARGS` answers one chat request.
serve_and_ask() {
    local port
    port=$(free_port)
    run_installed /usr/bin/specdeck serve --port "$port" --no-draft \
        --main "$models/SmolLM2-135M-Instruct.Q4_1.gguf" "$@" >"$log" 2>&1 &
    local server=$!
    for _ in $(seq 1 120); do
        curl -s "http://127.0.0.1:$port/v1/models" | grep -q '"unavailable": null' && break
        sleep 0.5
    done
    local answer constrained
    answer=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" \
        -H 'Content-Type: application/json' \
        -d '{"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}')
    # A grammar (llguidance is in the bundle): the answer is one of its two words.
    constrained=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" \
        -H 'Content-Type: application/json' \
        -d '{"messages": [{"role": "user", "content": "Yes or no?"}], "max_tokens": 8,
             "grammar": "root ::= \"yes\" | \"no\""}')
    kill "$server"
    pkill -f "serve --port $port" || true
    wait "$server" || true
    echo "$answer" | grep -q '"object": "chat.completion"' || { cat "$log"; echo "$answer"; exit 1; }
    echo "$constrained" | grep -Eq '"content": "(yes|no)"' || { cat "$log"; echo "$constrained"; exit 1; }
}
echo "check: specdeck serve answers over HTTP"
serve_and_ask
# ... and with the main model on a worker: `specdeck worker` (llama.cpp's RPC server, from
# the bundle's llama.cpp) on loopback.
echo "check: the main model on a worker (specdeck worker, llama.cpp's RPC backend)"
worker_port=$(free_port)
run_installed /usr/bin/specdeck worker --port "$worker_port" --threads 1 >"$log.worker" 2>&1 &
worker=$!
for _ in $(seq 1 60); do
    (exec 3<>"/dev/tcp/127.0.0.1/$worker_port") 2>/dev/null && break
    sleep 0.5
done
serve_and_ask --rpc "127.0.0.1:$worker_port"
kill "$worker"
pkill -f "worker --port $worker_port" || true
wait "$worker" || true
grep -q "Accepted client connection" "$log.worker" || { cat "$log.worker"; exit 1; }
rm -f "$log" "$log.worker"
# The bundled llama.cpp carries SpecDeck's patch (packaging/llama.cpp): with the AVX2
# (Haswell) CPU library, the AVX2 one with AVX-VNNI (Alder Lake) and the AVX-512 one
# without VNNI (Skylake-X) where this CPU runs them, and the one llama.cpp picks here, the
# default main model's batches of 2..17 tokens reproduce single-token logits bit for bit,
# and SpecDeck's own kernels compute the logits llama.cpp's own paths compute. Run from
# the bundle's build environment (the same wheel) where the checkout has fetched that model.
main_model=$(build/bundle-venv/bin/python -c \
    'from backends.models.provision import DEFAULT_MAIN_KEY, model_path; print(model_path(DEFAULT_MAIN_KEY))')
variants=""
grep -qw avx2 /proc/cpuinfo && variants="haswell"
grep -qw avx_vnni /proc/cpuinfo && variants="$variants alderlake"
grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo && variants="$variants skylakex"
if [ -f "$main_model" ] && [ -n "$variants" ]; then
    for variant in $variants own; do
        [ "$variant" = own ] && library="" || library=$variant
        echo "check: bit-exact batches with the bundle's $variant CPU library"
        result=$(SPECDECK_CPU_VARIANT=$library build/bundle-venv/bin/python -m \
            benchmarks.exact_batches --child on --model "$main_model" --probe 17 \
            --exactness-only 2>/dev/null | tail -n 1)
        echo "$result"
        case $result in
            *'"all_probed_exact": true'*) ;;
            *) echo "check: batched logits differ from single-token ones" >&2; exit 1 ;;
        esac
        echo "check: the bundle's $variant CPU library with SpecDeck's kernels off gives the same logits"
        stock=$(SPECDECK_CPU_VARIANT=$library GGML_CPU_SPECDECK_KERNELS=0 \
            build/bundle-venv/bin/python -m benchmarks.exact_batches --child on \
            --model "$main_model" --probe 17 --exactness-only 2>/dev/null | tail -n 1)
        [ "${stock#*logit_digest}" = "${result#*logit_digest}" ] || {
            echo "check: SpecDeck's kernels change the logits ($result against $stock)" >&2
            exit 1
        }
    done
fi
echo "check: removing"
DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq specdeck >/dev/null
test ! -e /opt/specdeck && test ! -e /usr/bin/specdeck
echo "check: the .deb installs, validates, passes its self-test and removes cleanly"
