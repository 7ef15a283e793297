#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Build the local Kubernetes control plane and the Kubeflow controllers from
# their Go modules, into $DDPKIT_K8S_CACHE/bin (outside the repository), one
# binary per component and version. Idempotent: only absent binaries are built,
# so a warm run costs a few stat calls.
#
#   k8s/local/build.sh            # everything up.sh needs
#   k8s/local/build.sh kube       # only etcd, kube-apiserver, kube-controller-manager
#   k8s/local/build.sh kubeflow   # only training-operator, jobset, trainer
#
# Two module groups (gomod/kube, gomod/kubeflow) are built by two concurrent
# `go build` runs, each building all of its mains at once so shared packages
# compile once; that keeps both cores busy, including while the other links.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"

# A go.mod naming a newer Go would otherwise make the go command fetch a
# toolchain by itself; the only approved one must be asked for explicitly
# (export GOTOOLCHAIN=go1.27.3), so default to the machine's own Go.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
# Other engineers share the two cores: builds run niced.
NICE="${DDPKIT_K8S_NICE:-10}"
LOGS="$DDPKIT_K8S_CACHE/logs"
# The compiler's cache (~4 GB after a cold build) is ours, not the user's ~/.cache/go-build,
# and goes once every binary is built: the binaries are what is kept, and disk is shared.
# A failed build keeps it for the retry. The module cache stays (up.sh reads CRDs from it).
export GOCACHE="$DDPKIT_K8S_CACHE/go-build"
mkdir -p "$K8S_BIN" "$LOGS"
# One build at a time, and a sign to whoever waits for one: the k8s tests wait on this lock
# when binaries are absent (.ci/run starts the build beside `make setup` and the other test
# lanes, so on a new machine the k8s tests find it still running). Held until every group
# has finished: the background `go build`s inherit the descriptor.
exec 9>"$DDPKIT_K8S_CACHE/build.lock"
flock 9

# The Go packages of each binary, by group. `go build -o DIR` names a binary
# after the last element of its package path (dropping a /vN suffix), which
# is the first field of each entry; it is renamed to the keyed path after.
KUBE_MAINS=(
    "server|go.etcd.io/etcd/server/v3|$ETCD_BIN"
    "kube-apiserver|k8s.io/kubernetes/cmd/kube-apiserver|$APISERVER_BIN"
    "kube-controller-manager|k8s.io/kubernetes/cmd/kube-controller-manager|$KCM_BIN"
)
KUBEFLOW_MAINS=(
    "training-operator.v1|github.com/kubeflow/training-operator/cmd/training-operator.v1|$TRAINING_OPERATOR_BIN"
    "jobset|sigs.k8s.io/jobset|$JOBSET_BIN"
    "trainer-controller-manager|github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager|$TRAINER_BIN"
)

# Kubernetes binaries report their version from link-time variables; without
# them the API server says v0.0.0-master, which clients and controllers that
# check the server version would misread.
kube_ldflags() {
    local minor
    minor="$(echo "$KUBE_VERSION" | cut -d. -f2)"
    local v
    for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s ' \
            "$v" "$KUBE_VERSION" "$v" "$v" "$minor"
    done
}

# Fail early when versions.sh and a go.mod disagree: the binary names would
# then lie about what was built.
check_pin() { # MODULE_DIR MODULE WANT
    local got
    got="$(cd "$1" && k8s_go list -m -f '{{.Version}}' "$2")"
    if [[ "$got" != "$3" ]]; then
        echo "build.sh: $1/go.mod pins $2 $got, versions.sh says $3" >&2
        exit 1
    fi
}

# build_group NAME MODULE_DIR LDFLAGS ENTRY...: build the absent binaries of
# one group with one `go build`, then move each into place atomically (a
# killed build never leaves a half-written binary under its final name).
build_group() {
    local name="$1" moddir="$2" ldflags="$3"
    shift 3
    local pkgs=() entry out pkg dest
    for entry in "$@"; do
        IFS='|' read -r out pkg dest <<<"$entry"
        [[ -x "$dest" ]] || pkgs+=("$pkg")
    done
    if ((${#pkgs[@]} == 0)); then
        echo "build.sh: $name: all present"
        return 0
    fi
    local tmp
    tmp="$(mktemp -d "$DDPKIT_K8S_CACHE/tmp.$name.XXXXXX")"
    echo "build.sh: $name: building ${pkgs[*]} (log: $LOGS/build-$name.log)"
    local start=$SECONDS
    if ! (cd "$moddir" && nice -n "$NICE" "$GO_BIN" build -trimpath -buildvcs=false \
        -ldflags "-s -w $ldflags" -o "$tmp/" "${pkgs[@]}") \
        >"$LOGS/build-$name.log" 2>&1; then
        tail -n 30 "$LOGS/build-$name.log" >&2
        rm -rf "$tmp"
        echo "build.sh: $name: FAILED after $((SECONDS - start)) s" >&2
        return 1
    fi
    for entry in "$@"; do
        IFS='|' read -r out pkg dest <<<"$entry"
        if [[ -e "$tmp/$out" ]]; then
            mv -f "$tmp/$out" "$dest"
        fi
    done
    rm -rf "$tmp"
    echo "build.sh: $name: built in $((SECONDS - start)) s"
}

# `nice` needs a program, not the k8s_go shell function: resolve go once.
GO_BIN="$(command -v go || echo /usr/local/go/bin/go)"

want_kube=1 want_kubeflow=1
case "${1:-all}" in
    all) ;;
    kube) want_kubeflow=0 ;;
    kubeflow) want_kube=0 ;;
    *)
        echo "usage: $0 [all|kube|kubeflow]" >&2
        exit 2
        ;;
esac

pids=()
if ((want_kube)); then
    check_pin "$HERE/gomod/kube" k8s.io/kubernetes "$KUBE_VERSION"
    check_pin "$HERE/gomod/kube" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
    build_group kube "$HERE/gomod/kube" "$(kube_ldflags)" "${KUBE_MAINS[@]}" &
    pids+=("$!")
fi
if ((want_kubeflow)); then
    check_pin "$HERE/gomod/kubeflow" github.com/kubeflow/training-operator "$TRAINING_OPERATOR_VERSION"
    check_pin "$HERE/gomod/kubeflow" github.com/kubeflow/trainer/v2 "$TRAINER_VERSION"
    check_pin "$HERE/gomod/kubeflow" sigs.k8s.io/jobset "$JOBSET_VERSION"
    build_group kubeflow "$HERE/gomod/kubeflow" "" "${KUBEFLOW_MAINS[@]}" &
    pids+=("$!")
fi
rc=0
for pid in "${pids[@]}"; do
    wait "$pid" || rc=1
done
if ((rc == 0)); then
    rm -rf "$GOCACHE"
fi
exit "$rc"
