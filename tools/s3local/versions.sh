# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts that source this
# Version and paths shared by build.sh, up.sh and down.sh (sourced, not run).
#
# The local S3-compatible server is Versity's S3 Gateway (versitygw, Apache-2.0), which
# serves S3 over a POSIX directory in production HPC archives. It is built from its Go
# module like the Kubernetes control plane (k8s/local/build.sh). MinIO's server is AGPL and
# its module graph is several times larger (a cold build far longer on two cores).
# The version must equal what gomod/go.mod pins: build.sh checks that.
VERSITYGW_VERSION=v1.8.0

# The binary lives outside the repository, keyed by version (CI reuses the machine).
DDPKIT_S3_CACHE="${DDPKIT_S3_CACHE:-$HOME/.cache/ddpkit-s3}"
S3_BIN="$DDPKIT_S3_CACHE/bin/versitygw-$VERSITYGW_VERSION"
# `make s3-up`'s runtime state: the objects, the pid, the log, the credentials (mode 600).
DDPKIT_S3_STATE="${DDPKIT_S3_STATE:-/tmp/ddpkit-s3}"

s3_go() {
    if command -v go >/dev/null 2>&1; then
        command go "$@"
    else
        /usr/local/go/bin/go "$@"
    fi
}
