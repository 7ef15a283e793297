#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Build the local S3-compatible server (versitygw) from its Go module into
# $DDPKIT_S3_CACHE/bin, outside the repository. Idempotent: a present binary is kept, so a
# warm run costs a stat. The S3 tests wait on this script's lock while a build runs (.ci/run
# starts it in the background beside the Kubernetes build); a test that finds no binary and
# no build runs this script itself.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"

export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
NICE="${DDPKIT_S3_NICE:-10}"  # the machine is shared: builds run niced
# The compiler's cache is ours, and goes once the binary is built (disk is shared).
export GOCACHE="$DDPKIT_S3_CACHE/go-build"
mkdir -p "$(dirname "$S3_BIN")"
exec 9>"$DDPKIT_S3_CACHE/build.lock"
flock 9

if [[ -x "$S3_BIN" ]]; then
    echo "build.sh: versitygw $VERSITYGW_VERSION present"
    exit 0
fi
got="$(cd "$HERE/gomod" && s3_go list -m -f '{{.Version}}' github.com/versity/versitygw)"
if [[ "$got" != "$VERSITYGW_VERSION" ]]; then
    echo "build.sh: gomod/go.mod pins versitygw $got, versions.sh says $VERSITYGW_VERSION" >&2
    exit 1
fi
GO_BIN="$(command -v go || echo /usr/local/go/bin/go)"
tmp="$(mktemp -d "$DDPKIT_S3_CACHE/tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
echo "build.sh: building versitygw $VERSITYGW_VERSION"
(cd "$HERE/gomod" && nice -n "$NICE" "$GO_BIN" build -trimpath -buildvcs=false \
    -ldflags "-s -w" -o "$tmp/versitygw" github.com/versity/versitygw/cmd/versitygw)
mv -f "$tmp/versitygw" "$S3_BIN"  # a killed build never leaves a half-written binary
rm -rf "$GOCACHE"
echo "build.sh: versitygw built in $((SECONDS - start)) s"
