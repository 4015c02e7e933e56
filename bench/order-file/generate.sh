#!/bin/bash
# Regenerates Extensions/hot-text.order: the functions a worker runs (start-up, handshake, requests, streaming,
# attachments, crashes), which Package.swift hands to lld for the bundled extensions so that they sit together at
# the front of the text. Why: docs/BENCHMARKS.md, "A killed worker's teardown, and the hot-text order".
#
# Needs valgrind (callgrind lists every function that ran, but on its own emulated CPU), python3 and objdump and,
# when it can record, perf (samples of native runs add glibc's variants for this CPU and its start-up code).
# Neither the build nor the tests need this script or its tools; a stale order file only costs layout.
#
#   bash bench/order-file/generate.sh          # builds release, profiles, writes Extensions/hot-text.order
#   KEEP_WORK=1 bash bench/order-file/generate.sh   # the same, keeping the profiles in /tmp/sdk-host-order.*
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
command -v valgrind >/dev/null || { echo "generate.sh: needs valgrind" >&2; exit 1; }
[ -f Extensions/hot-text.order ] || : > Extensions/hot-text.order  # Package.swift links with it
swift build -c release >/dev/null
bin=$root/.build/release
work=$(mktemp -d /tmp/sdk-host-order.XXXXXX)
[ -n "${KEEP_WORK:-}" ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/cg"

# Each bundled extension, run under callgrind by a wrapper the host finds first on its executable search path.
for x in Echo Crasher AsyncEcho Ticker; do
    printf '#!/bin/sh\nexec valgrind -q --tool=callgrind --demangle=no --dump-instr=no --callgrind-out-file=%s/cg/%s.%%p.out %s/%s "$@"\n' \
        "$work" "$x" "$bin" "$x" > "$work/bin/$x"
    chmod +x "$work/bin/$x"
done
cat > "$work/config.plist" <<PLIST
<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict>
<key>ExecutableSearchPaths</key><array><string>$work/bin</string></array>
<key>ExtensionSearchPaths</key><array><string>$root/Extensions</string></array>
<key>HeartbeatTimeoutSeconds</key><real>120</real>
<key>DefaultPolicy</key><dict><key>Sandbox</key><string>none</string></dict>
<key>AllowedSandboxModes</key><array><string>strict</string><string>bestEffort</string><string>none</string></array>
</dict></plist>
PLIST
echo "attachment" > "$work/attachment.txt"
# A request that fails (a refused manifest, say) leaves no profile behind: say so, or the order loses its names.
request() {
    timeout 120 "$bin/sdk-host" request "$@" --embedded --config "$work/config.plist" --timeout 60 >/dev/null 2>"$work/err" || true
    grep -h 'refused\|not found\|cannot' "$work/err" | sed 's/^/generate.sh: /' >&2 || true
}
request com.example.echo --text hello
request com.example.echo --text hello --attach "$work/attachment.txt"
for t in slow:10 cancel double segv abort exit; do request com.example.crasher --text "$t"; done
request com.example.ticker --text 3:10 --stream
request com.example.async-echo --text hello

# Native samples of cold starts and of the quick bench's workers, when perf may record.
: > "$work/native.txt"
if command -v perf >/dev/null && perf record -q -e cpu-clock -F 20000 -a -o "$work/perf.data" -- \
    sh -c "'$bin/sdk-host' bench cold --json >/dev/null 2>&1; '$bin/sdk-host' bench --quick --json >/dev/null 2>&1" 2>/dev/null
then
    perf script -i "$work/perf.data" -F ip,sym,dso --no-demangle 2>/dev/null \
        | sed -nE 's/^ *[0-9a-f]+ ([^ ]+) \(.*release\/(Echo|Crasher|AsyncEcho|Ticker)\)$/\1/p' > "$work/native.txt" || true
else
    echo "generate.sh: perf could not record; the order has callgrind's names only" >&2
fi

toolchain=$(dirname "$(dirname "$(readlink -f "$(command -v swift)")")")
ls "$work/cg"/*.out >/dev/null 2>&1 || { echo "generate.sh: no worker ran under callgrind" >&2; exit 1; }
python3 "$root/bench/order-file/compose.py" "$work/cg" "$work/native.txt" \
    "$toolchain/lib/swift_static/linux" > "$root/Extensions/hot-text.order"
# SwiftPM does not see the order file as an input of the link: relink the extensions with the new one.
(cd "$bin" && rm -f Echo Crasher AsyncEcho Ticker)
swift build -c release >/dev/null
echo "wrote Extensions/hot-text.order ($(grep -vc '^#' "$root/Extensions/hot-text.order") names)"
