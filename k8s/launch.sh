#!/usr/bin/env bash
# Container command of every ddpkit pod on Kubernetes (PyTorchJob and TrainJob). The
# renderer embeds this file as `bash -c <this> ddpkit-k8s HOST_POD WAIT_S NODE_ARGS...`;
# every user value arrives as an argument, never as part of this text. NODE_ARGS go to the
# node launcher every backend runs (python -m ddpkit.train.node [flags] -- <entry point>).
#
#   HOST_POD  the pod that hosts the rendezvous: <job>-master-0 (static), <job>-worker-0 (elastic)
#   WAIT_S    how long a non-host pod waits for a TCP connection to the rendezvous endpoint
#
# The controller injects the rendezvous as PET_* variables (torchrun, inside the node
# launcher, reads them as the defaults of its flags): PET_MASTER_ADDR/PET_MASTER_PORT/PET_NODE_RANK for a static job
# or a TrainJob, PET_RDZV_ENDPOINT for an elastic one. A pod can start before the host's
# Service resolves or before its port listens, and torch fails at once on a name that does
# not resolve, so the other pods first wait for a real TCP connection, not only DNS.
set -euo pipefail

host_pod=$1
wait_s=$2
shift 2

# wait_for_tcp WHAT HOST PORT: until a TCP connection to HOST:PORT opens, at most WAIT_S.
wait_for_tcp() {
    local deadline=$((SECONDS + wait_s))
    # shellcheck disable=SC2016  # $0/$1 expand in the inner shell
    until timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$2" "$3" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            echo "ddpkit: $1 not reachable after ${wait_s}s" >&2
            exit 1
        fi
        sleep 2
    done
}

# RDMA registers (pins) memory, so it needs an unlimited locked-memory limit. A non-root
# process cannot raise it itself (an added IPC_LOCK never reaches its effective set), so the
# limit must come from the node's container runtime: say so now rather than let NCCL fail.
if [[ ${DDPKIT_REQUIRE_MEMLOCK:-} == unlimited && $(ulimit -l) != unlimited ]]; then
    echo "ddpkit: RDMA needs an unlimited locked-memory limit but this container has" \
        "$(ulimit -l) KiB; raise it in the nodes' container runtime (containerd:" \
        "LimitMEMLOCK=infinity in its systemd unit; CRI-O: default_ulimits memlock=-1:-1)" >&2
    exit 1
fi

if [[ -n ${TORCHFT_LIGHTHOUSE:-} ]]; then
    # fault_tolerance = torchft: this pod is one replica group, the one of its node rank: a
    # standalone torchrun under the replica-group supervisor, which restarts it in place (the
    # other pods train on). The job-wide PET_* rendezvous is not this group's: torchrun must
    # not read it. NODE_ARGS are the supervisor's (python -m ddpkit.train.replica_groups).
    export DDPKIT_NODE_RANK=${PET_NODE_RANK:?not started by a PyTorchJob controller (no PET_NODE_RANK)}
    for name in "${!PET_@}"; do unset "$name"; done
    echo "ddpkit: replica group $DDPKIT_NODE_RANK, lighthouse $TORCHFT_LIGHTHOUSE" >&2
    # The lighthouse is its own pod, created with (after) the job: wait for its Service to
    # answer, as the other pods wait for the rendezvous host below.
    lh=${TORCHFT_LIGHTHOUSE#*://}
    lh=${lh%%/*}
    wait_for_tcp "lighthouse $TORCHFT_LIGHTHOUSE" "${lh%:*}" "${lh##*:}"
    exec python -m ddpkit.train.replica_groups "$@"
fi

if [[ -n ${PET_RDZV_ENDPOINT:-} ]]; then
    endpoint=$PET_RDZV_ENDPOINT
else
    endpoint=${PET_MASTER_ADDR:?not started by a PyTorchJob/TrainJob controller (no PET_MASTER_ADDR or PET_RDZV_ENDPOINT)}:${PET_MASTER_PORT:?PET_MASTER_PORT unset}
fi

# The host: node rank 0 where the controller assigns ranks, else the pod named HOST_POD
# (elastic jobs, where torchrun assigns ranks). POD_NAME comes from the downward API.
if [[ -n ${PET_NODE_RANK:-} ]]; then
    [[ $PET_NODE_RANK == 0 ]] && is_host=1 || is_host=0
else
    [[ ${POD_NAME:-} == "$host_pod" ]] && is_host=1 || is_host=0
fi

if ((!is_host)); then
    wait_for_tcp "rendezvous endpoint $endpoint" "${endpoint%:*}" "${endpoint##*:}"
    echo "ddpkit: rendezvous endpoint $endpoint is up" >&2
fi

# c10d elects the TCPStore host by matching the endpoint against this machine's names;
# say it explicitly so an IP endpoint (or pods sharing a node) cannot elect two hosts.
extra=()
if [[ -n ${PET_RDZV_ENDPOINT:-} ]]; then
    extra+=(--rdzv-conf "${PET_RDZV_CONF:+$PET_RDZV_CONF,}is_host=$is_host")
fi
# A fixed-size PyTorchJob (restartPolicy ExitCode): ddpkit.k8s.attempt counts this pod's
# start on the claim against the job's restart budget and maps the node launcher's exit
# status to the operator's (128 and above: recreate the pod; below: the job fails).
# It waits for the host pod of its attempt as long as this script waited for the endpoint.
launcher=ddpkit.train.node
[[ -n ${DDPKIT_POD_RESTART_LIMIT:-} ]] && launcher=ddpkit.k8s.attempt
export DDPKIT_RDZV_WAIT_S=$wait_s
echo "ddpkit: python -m $launcher ${extra[*]} $*" >&2
exec python -m "$launcher" "${extra[@]}" "$@"
