#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Start the local S3-compatible server (versitygw over a directory) on loopback, build it
# first if absent, and make a bucket. The credentials are made here, random, and written
# only into $DDPKIT_S3_STATE/env (mode 600), never printed:
#
#   make s3-up && source /tmp/ddpkit-s3/env     # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...
#   ddpkit run --set 'ckpt_dir="s3://ddpkit/myrun"'
#
# DDPKIT_S3_PORT (default 9000) and DDPKIT_S3_BUCKET (default ddpkit) choose the rest.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KIT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"
PORT="${DDPKIT_S3_PORT:-9000}"
BUCKET="${DDPKIT_S3_BUCKET:-ddpkit}"
PY="${DDPKIT_S3_PYTHON:-$KIT/.venv/bin/python}"

if [[ -f "$DDPKIT_S3_STATE/pid" ]] && kill -0 "$(cat "$DDPKIT_S3_STATE/pid")" 2>/dev/null; then
    echo "s3: already up (source $DDPKIT_S3_STATE/env)"
    exit 0
fi
bash "$HERE/build.sh"
mkdir -p "$DDPKIT_S3_STATE/data"
chmod 700 "$DDPKIT_S3_STATE"
key() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
access="ddpkit$(key 6)"
secret="$(key 20)"
umask 077
cat >"$DDPKIT_S3_STATE/env" <<ENV
export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT
export AWS_ACCESS_KEY_ID=$access
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_DEFAULT_REGION=us-east-1
ENV
# The server reads its root credentials from the environment: nothing on its command line.
ROOT_ACCESS_KEY_ID="$access" ROOT_SECRET_ACCESS_KEY="$secret" \
    setsid "$S3_BIN" --port "127.0.0.1:$PORT" --region us-east-1 \
    posix "$DDPKIT_S3_STATE/data" >"$DDPKIT_S3_STATE/server.log" 2>&1 </dev/null &
echo $! >"$DDPKIT_S3_STATE/pid"
for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
        break
    fi
    if ! kill -0 "$(cat "$DDPKIT_S3_STATE/pid")" 2>/dev/null; then
        echo "s3: the server exited; its log:" >&2
        tail -n 20 "$DDPKIT_S3_STATE/server.log" >&2
        exit 1
    fi
    sleep 0.1
done
# shellcheck source=/dev/null
. "$DDPKIT_S3_STATE/env"
if [[ -x "$PY" ]] && "$PY" -c 'import s3fs' 2>/dev/null; then
    "$PY" -c 'import s3fs, sys; fs = s3fs.S3FileSystem(); fs.exists(sys.argv[1]) or fs.mkdir(sys.argv[1])' "$BUCKET"
    made="bucket s3://$BUCKET"
else
    made="no bucket made (no s3fs in $PY: make setup)"
fi
echo "s3: versitygw $VERSITYGW_VERSION on 127.0.0.1:$PORT, $made; objects in $DDPKIT_S3_STATE/data"
echo "s3: credentials: source $DDPKIT_S3_STATE/env"
