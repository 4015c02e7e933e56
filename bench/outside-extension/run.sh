#!/usr/bin/env bash
# The cold start of an extension built in a package of its own (Examples/GreeterExtension's Greeter), the
# ordinary way (SwiftPM's default: dynamically linked against the Swift runtime) and with the flags
# docs/EXTENSIONS.md recommends (fully static, lld), beside the bundled Echo's: `sdk-host bench cold
# --extension com.example.greeter` against each build. Release builds; everything goes to a temporary folder,
# which is removed at the end.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d /tmp/sdkhost-outside-XXXXXX)"
trap 'rm -rf "$work"' EXIT
# SwiftPM puts lock files named after each scratch path in TMPDIR: keep them in the folder that goes.
export TMPDIR="$work"
cd "$root"
swift build -c release --product sdk-host >/dev/null
swift build -c release --package-path Examples/GreeterExtension --product Greeter --scratch-path "$work/dynamic" >/dev/null
swift build -c release --package-path Examples/GreeterExtension --product Greeter --scratch-path "$work/static" \
    -Xswiftc -static-executable -Xswiftc -use-ld=lld >/dev/null
for build in dynamic static; do
    cat > "$work/$build.plist" <<PLIST
<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict>
  <key>ExtensionSearchPaths</key><array><string>$root/Extensions</string><string>$root/Examples/GreeterExtension/Manifests</string></array>
  <key>ExecutableSearchPaths</key><array><string>$root/.build/release</string><string>$work/$build/release</string></array>
</dict></plist>
PLIST
    echo "== Greeter linked $build"
    .build/release/sdk-host bench cold "$@" --config "$work/$build.plist" --extension com.example.greeter \
        | grep -E "round trip p50|default sandbox|com.example.greeter"
done
