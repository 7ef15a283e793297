# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts that source this
# Versions and paths shared by build.sh, up.sh and down.sh (sourced, not run).
#
# The versions must equal what gomod/*/go.mod pin: build.sh checks that, so
# a bump is a change to go.mod (then `go mod tidy`) plus the line here.

# kube-apiserver / kube-controller-manager: a current release, and the one
# whose client libraries (k8s.io/* v0.36.x) all three Kubeflow-side controllers
# are built against; it is also declared for Go 1.26 (go.mod `go 1.26.0`).
KUBE_VERSION=v1.36.3
# The etcd server that kubernetes v1.36.3 itself pins in its go.mod.
ETCD_VERSION=v3.6.8
# Kubeflow training operator (PyTorchJob kubeflow.org/v1): newest v1.9.x served.
TRAINING_OPERATOR_VERSION=v1.9.4
# Kubeflow Trainer (TrainJob trainer.kubeflow.org/v1alpha1): v2.3.0 is the only
# v2.3.x the module proxy serves.
TRAINER_VERSION=v2.3.0
# JobSet: the version Trainer v2.3.0's go.mod requires.
JOBSET_VERSION=v0.12.0

# Build outputs live outside the repository, keyed by version, so a checkout
# can be cleaned or re-cloned without rebuilding (CI reuses the machine).
DDPKIT_K8S_CACHE="${DDPKIT_K8S_CACHE:-$HOME/.cache/ddpkit-k8s}"
K8S_BIN="$DDPKIT_K8S_CACHE/bin"
# Runtime state (etcd data, certificates, kubeconfig, logs, pids).
DDPKIT_K8S_STATE="${DDPKIT_K8S_STATE:-/tmp/ddpkit-k8s}"

ETCD_BIN="$K8S_BIN/etcd-$ETCD_VERSION"
APISERVER_BIN="$K8S_BIN/kube-apiserver-$KUBE_VERSION"
KCM_BIN="$K8S_BIN/kube-controller-manager-$KUBE_VERSION"
TRAINING_OPERATOR_BIN="$K8S_BIN/training-operator-$TRAINING_OPERATOR_VERSION"
JOBSET_BIN="$K8S_BIN/jobset-controller-$JOBSET_VERSION"
TRAINER_BIN="$K8S_BIN/trainer-controller-manager-$TRAINER_VERSION"

# The machines have Go at /usr/local/go/bin, which is not always on PATH.
k8s_go() {
    if command -v go >/dev/null 2>&1; then
        command go "$@"
    else
        /usr/local/go/bin/go "$@"
    fi
}

# Where `go mod download` put a module's source (read-only): CRDs, webhook
# configurations and runtimes are read from there at start, never copied
# into the repository. Run inside a gomod/* module so the go.sum applies.
k8s_mod_dir() { # MODULE VERSION
    k8s_go mod download -json "$1@$2" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}
