#!/usr/bin/env bash
# ddpkit container entrypoint: torchrun -> python -m train on this node.
#
#   <image> [train flags]     torchrun, one process per visible GPU (NCCL), or one per usable
#                             CPU with gloo when no GPU is visible; the flags go to train.
#   <image> COMMAND [ARGS]    runs COMMAND as given (bash, python, torchrun ...), for
#                             launchers that build the whole command line themselves.
#
# torchrun reads PET_<FLAG> variables as the defaults of its flags (a PyTorchJob sets
# PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, ...). This script passes no flag whose PET_
# variable is set, so the launcher's values win; PET_NPROC_PER_NODE overrides the process
# count. Without any rendezvous variable the run is single-node (--standalone).
#
# Signals: TERM, INT, HUP, QUIT, USR1 and USR2 are forwarded to torchrun, which forwards them
# to the workers (--signals-to-handle); the workers save a checkpoint and rank 0 writes
# <run dir>/requeue.json. torchrun itself exits 1 then, so this script turns that file into
# exit status 75 ("saved after a preemption signal, please requeue").
set -euo pipefail

readonly EXIT_REQUEUE=75
readonly HANDLED_SIGNALS="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
DDPKIT_HOME=${DDPKIT_HOME:-/opt/ddpkit}

if [[ $# -gt 0 && $1 != -* ]]; then
    exec "$@"
fi
for arg in "$@"; do
    case $arg in
        -h | --help | --print-config) exec python -m train "$@" ;;
    esac
done

# Validates the flags (one line and exit 2 on bad input) and resolves the run dir.
plan=$(python "$DDPKIT_HOME/docker/launch_plan.py" "$@") || exit $?
mapfile -t lines <<<"$plan"
run_dir=${lines[0]}
shutdown_timeout=${lines[1]}
nproc=${lines[2]:-}

launch=()
[[ -n ${PET_SIGNALS_TO_HANDLE:-} ]] || launch+=(--signals-to-handle "$HANDLED_SIGNALS")
[[ -n ${PET_SHUTDOWN_TIMEOUT:-} ]] || launch+=(--shutdown-timeout "$shutdown_timeout")
[[ -n $nproc ]] && launch+=(--nproc-per-node "$nproc")
if [[ -z ${PET_NNODES:-}${PET_RDZV_ENDPOINT:-}${PET_MASTER_ADDR:-}${PET_STANDALONE:-} ]]; then
    launch+=(--standalone)
fi

started=$(date +%s)
echo "ddpkit: torchrun ${launch[*]} -m train $*" >&2
torchrun "${launch[@]}" -m train "$@" &
child=$!

# As PID 1 a shell ignores signals it has no trap for; forward each to torchrun.
for sig in TERM INT HUP QUIT USR1 USR2; do
    # shellcheck disable=SC2064  # expand $sig now: one trap per signal
    trap "kill -s $sig $child 2>/dev/null || true" "$sig"
done

# `wait` returns early (status > 128) when a trapped signal arrives: wait again until
# torchrun has really exited, then read its status.
status=0
while :; do
    wait "$child" && status=0 || status=$?
    kill -0 "$child" 2>/dev/null || break
done
if ((status > 128)); then
    wait "$child" && status=0 || status=$?
fi

requeue="$run_dir/requeue.json"
if [[ -f $requeue ]] && (($(stat -c %Y "$requeue") >= started)); then
    echo "ddpkit: checkpoint saved after a preemption signal; exiting $EXIT_REQUEUE (requeue)" >&2
    exit "$EXIT_REQUEUE"
fi
exit "$status"
