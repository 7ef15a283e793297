#!/usr/bin/env bash
# ddpkit container entrypoint: the node launcher (python -m ddpkit.train.node) on this node.
#
#   <image> [train flags]              the kit's trainer with these flags
#   <image> [node flags] -- ENTRY...   what the launcher renders: the node launcher's flags
#                                      (--run-dir, --shutdown-timeout, --max-restarts ...)
#                                      and the entry point (-m ddpkit.train FLAGS, -m MODULE ARGS,
#                                      or SCRIPT ARGS: the user's code in the image)
#   <image> COMMAND [ARGS]             runs COMMAND as given (bash, python, torchrun ...), for
#                                      launchers that build the whole command line themselves
#
# The node launcher (train/node.py) runs torchrun in process with the launch contract: the
# stop signals reach the workers, the shutdown budget, and one exit status (2 bad input,
# 3 diverged, 75 saved after a stop signal: requeue). This script only adds what depends on
# the container: the process count (one per visible GPU, else one per usable CPU with gloo;
# PET_NPROC_PER_NODE overrides) and --standalone when no rendezvous is given. torchrun reads
# PET_<FLAG> variables (a PyTorchJob sets them) as the defaults of its flags.
set -euo pipefail

DDPKIT_HOME=${DDPKIT_HOME:-/opt/ddpkit}

if [[ $# -gt 0 && $1 != -* ]]; then
    exec "$@"
fi
node_mode=0
for arg in "$@"; do
    [[ $arg == -- ]] && node_mode=1 && break
done
if ((!node_mode)); then
    for arg in "$@"; do
        case $arg in
            -h | --help | --print-config) exec python -m ddpkit.train "$@" ;;
        esac
    done
    set -- -- -m ddpkit.train "$@"
fi

launch=()
if [[ -z ${PET_NPROC_PER_NODE:-} ]]; then
    launch+=(--nproc-per-node "$(python -m ddpkit.docker.nproc)")
fi
if [[ -z ${PET_NNODES:-}${PET_RDZV_ENDPOINT:-}${PET_MASTER_ADDR:-}${PET_STANDALONE:-} ]]; then
    launch+=(--standalone)
fi
echo "ddpkit: python -m ddpkit.train.node ${launch[*]} $*" >&2
# exec: the node launcher is PID 1; torchrun inside it handles the stop signals.
exec python -m ddpkit.train.node "${launch[@]}" "$@"
