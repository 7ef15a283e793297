#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Stop the server `make s3-up` started; the objects stay in $DDPKIT_S3_STATE/data
# (DDPKIT_S3_WIPE=1 removes them too).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"
pidfile="$DDPKIT_S3_STATE/pid"
if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill "$(cat "$pidfile")"
    echo "s3: stopped"
else
    echo "s3: not running"
fi
rm -f "$pidfile" "$DDPKIT_S3_STATE/env"
if [[ "${DDPKIT_S3_WIPE:-0}" == 1 ]]; then
    rm -rf "$DDPKIT_S3_STATE"
fi
