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

# Reverse start order, in groups stopped together (each daemon takes a few
# seconds to shut down cleanly; one group at a time keeps the order that
# matters): the node agent first, so it does not report on pods while the
# API server stops; then the controllers; the API server; etcd last, so
# nothing writes to a store that is going away.
GROUPS_=("node-agent"
    "trainer-controller-manager jobset-controller training-operator kube-controller-manager"
    "kube-apiserver" "etcd")

# A pid file may outlive its process and the pid be reused: only signal a
# process whose command line still names our state or binary directory.
ours() { # PID
    [[ -r "/proc/$1/cmdline" ]] || return 1
    tr '\0' ' ' <"/proc/$1/cmdline" | grep -qF -e "$K8S_BIN" -e "$S" -e "$HERE"
}

stop_group() { # NAME...
    local name f pid names=() pids=()
    for name in "$@"; do
        f="$S/run/$name.pid"
        [[ -f "$f" ]] || continue
        pid="$(cat "$f")"
        if [[ -n "$pid" ]] && ours "$pid"; then
            kill -TERM "$pid" 2>/dev/null || true
            names+=("$name")
            pids+=("$pid")
        fi
        rm -f "$f"
    done
    local i j
    # Up to 15 s for a clean exit (etcd flushes, controllers release).
    for ((i = 0; i < 150; i++)); do
        local left=0
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then left=1; fi
        done
        ((left)) || break
        sleep 0.1
    done
    for ((j = 0; j < ${#pids[@]}; j++)); do
        if kill -0 "${pids[j]}" 2>/dev/null; then
            echo "down.sh: ${names[j]} (pid ${pids[j]}) ignored SIGTERM; killing it" >&2
            kill -KILL "${pids[j]}" 2>/dev/null || true
        fi
        echo "down.sh: stopped ${names[j]} (pid ${pids[j]})"
    done
}

if [[ -d "$S/run" ]]; then
    for group in "${GROUPS_[@]}"; do
        # shellcheck disable=SC2086 # a group is a list of names
        stop_group $group
    done
fi
# The training operator's certificate files (a fixed path in its source):
# removed only if they are still the ones this state directory made.
TO_CERT_DIR=/tmp/k8s-webhook-server/serving-certs
if [[ -f "$S/pki/webhook.crt" ]] && cmp -s "$S/pki/webhook.crt" "$TO_CERT_DIR/tls.crt"; then
    rm -f "$TO_CERT_DIR/tls.crt" "$TO_CERT_DIR/tls.key" "$TO_CERT_DIR/ca.crt"
fi
if ((purge)); then
    rm -rf "$S"
    echo "down.sh: removed $S"
fi
