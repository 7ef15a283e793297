#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Stop the local control plane that up.sh started: exactly the processes whose
# pids up.sh recorded in $DDPKIT_K8S_STATE/run, controllers first, etcd last
# (so nothing writes to a store that is going away). Logs stay in
# $DDPKIT_K8S_STATE/logs for reading after a failed test; --purge removes
# the whole state directory as well.
#
#   k8s/local/down.sh [--purge]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"

S="$DDPKIT_K8S_STATE"
purge=0
case "${1:-}" in
    "") ;;
    --purge) purge=1 ;;
    *)
        echo "usage: $0 [--purge]" >&2
        exit 2
        ;;
esac

# Reverse start order. The node agent (if one runs) goes first so that it does
# not report on pods while the API server stops.
ORDER=(node-agent trainer-controller-manager jobset-controller training-operator
    kube-controller-manager kube-apiserver etcd)

# A pid file may outlive its process and the pid be reused: only signal a
# process whose command line still names our state or binary directory.
ours() { # PID
    [[ -r "/proc/$1/cmdline" ]] || return 1
    tr '\0' ' ' <"/proc/$1/cmdline" | grep -qF -e "$K8S_BIN" -e "$S" -e "$HERE"
}

stop() { # NAME
    local f="$S/run/$1.pid" pid
    [[ -f "$f" ]] || return 0
    pid="$(cat "$f")"
    if [[ -n "$pid" ]] && ours "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        # Up to 10 s for a clean exit (etcd flushes, controllers release).
        local i
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "down.sh: $1 (pid $pid) ignored SIGTERM; killing it" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        echo "down.sh: stopped $1 (pid $pid)"
    fi
    rm -f "$f"
}

if [[ -d "$S/run" ]]; then
    for name in "${ORDER[@]}"; do
        stop "$name"
    done
fi
if ((purge)); then
    rm -rf "$S"
    echo "down.sh: removed $S"
fi
