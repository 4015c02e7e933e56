#!/usr/bin/env bash
# Builds the go-plugin echo peer (echo_peer.go) and runs `sdk-host bench --quick` with it, so that go-plugin's
# figures print beside ours, and as ratios to the same raw socketpair round trip, in one run.
#
#   bench/go-plugin/run.sh            # bench --quick, table
#   bench/go-plugin/run.sh --json     # any further arguments go to `sdk-host bench`
#   SDK_HOST=/path/to/sdk-host bench/go-plugin/run.sh   # an sdk-host already built (release)
#
# Needs Go and go-plugin 1.0.1 from Debian (GOPATH mode against /usr/share/gocode, no network):
#   apt-get install golang-go golang-github-hashicorp-go-plugin-dev \
#       golang-google-grpc-dev golang-golang-x-net-dev golang-goprotobuf-dev
# (the last three are imports of go-plugin that its Debian package does not pull in). Neither the build nor the
# tests need any of this.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
gocode=/usr/share/gocode

if ! command -v go >/dev/null || [ ! -d "$gocode/src/github.com/hashicorp/go-plugin" ]; then
    echo "bench/go-plugin: Go or go-plugin is not installed; install them with:" >&2
    sed -n 's/^#   //p; s/^#       /    /p' "${BASH_SOURCE[0]}" | grep -E 'apt-get|golang' >&2
    exit 2
fi

work="$(mktemp -d /tmp/sdk-host-go-plugin.XXXXXX)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/sdkhostbench"
cp "$here/echo_peer.go" "$work/src/sdkhostbench/"
(cd "$work/src/sdkhostbench" && GO111MODULE=off GOPATH="$work:$gocode" GOCACHE="$work/cache" GOFLAGS= \
    go build -o "$work/echo-peer" .)

if [ -z "${SDK_HOST:-}" ]; then
    (cd "$root" && swift build -c release --product sdk-host >&2)
    SDK_HOST="$root/.build/release/sdk-host"
fi
cd "$root"
"$SDK_HOST" bench --quick --peer "$work/echo-peer" "$@"
