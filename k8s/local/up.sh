#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Start a real local Kubernetes control plane with the Kubeflow controllers:
#   etcd, kube-apiserver, kube-controller-manager (Jobs -> Pods),
#   the CRDs of PyTorchJob (training operator v1.9), JobSet and Trainer v2.3,
#   the three controllers with their admission webhooks served on 127.0.0.1
#   (self-signed certificates), and Trainer's `torch-distributed`
#   ClusterTrainingRuntime.
# There is no kubelet: pods stay Pending, unless DDPKIT_K8S_NODES=N starts
# node_agent.py (N Ready nodes whose pods run as local processes; its code is
# the nodeagent/ package beside it).
# Binaries come from build.sh, which up.sh runs first (instant when built).
#
# Everything runs from $DDPKIT_K8S_STATE (default /tmp/ddpkit-k8s):
#   kubeconfig   admin kubeconfig (client certificate in group system:masters)
#   logs/*.log   one log per daemon
#   run/*.pid    one pid file per daemon (down.sh stops exactly these)
# Each start is a fresh cluster: etcd data and certificates are made anew.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
. "$HERE/versions.sh"

S="$DDPKIT_K8S_STATE"
# DDPKIT_K8S_PORT_OFFSET moves every port below (and the node agent's kubelet port), so a
# second cluster can run beside one on the defaults (two test modules at once).
O="${DDPKIT_K8S_PORT_OFFSET:-0}"
ETCD_PORT="${DDPKIT_K8S_ETCD_PORT:-$((2379 + O))}"
ETCD_PEER_PORT="${DDPKIT_K8S_ETCD_PEER_PORT:-$((2380 + O))}"
API_PORT="${DDPKIT_K8S_API_PORT:-$((6443 + O))}"
KCM_PORT="${DDPKIT_K8S_KCM_PORT:-$((10257 + O))}"
KUBELET_PORT=$((10250 + O))
# Webhook and health ports of the controllers; all bound or called on 127.0.0.1.
TO_WEBHOOK_PORT=$((9443 + O)) TO_HEALTH_PORT=$((18081 + O))
JS_WEBHOOK_PORT=$((9444 + O)) JS_HEALTH_PORT=$((18082 + O))
TR_WEBHOOK_PORT=$((9445 + O)) TR_HEALTH_PORT=$((18083 + O))
# Trainer's status server (TrainJobStatus): pods POST their progress to it. It listens on every
# address (its source's ":PORT"), so pods reach it on the bridge's gateway too.
TR_STATUS_PORT=$((10443 + O))
# The name Trainer puts in the pods' KUBEFLOW_TRAINER_SERVER_URL: <webhook service>.<its
# namespace>.svc, its defaults; the node agent points it at this host, the certificate names it.
TR_STATUS_HOST=kubeflow-trainer-controller-manager.kubeflow-system.svc
# Services get addresses from this range; nothing routes to it and nothing
# here sends traffic to it (the controllers and kubectl use 127.0.0.1).
SERVICE_CIDR="${DDPKIT_K8S_SERVICE_CIDR:-10.96.0.0/16}"
SERVICE_APISERVER_IP="${DDPKIT_K8S_SERVICE_APISERVER_IP:-10.96.0.1}"
KUBECONFIG_FILE="$S/kubeconfig"
T0=$SECONDS
# wait_for silences the command it polls; alive() reports on this copy of stderr.
exec 3>&2

log() { echo "up.sh [$((SECONDS - T0))s]: $*"; }
die() {
    echo "up.sh: $*" >&2
    exit 1
}
kc() { kubectl --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# wait_for SECONDS WHAT CMD...: poll CMD until it succeeds; on time-out name
# the daemon log to read, since that is where the reason is.
wait_for() {
    local limit="$1" what="$2"
    shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= end)); then
            die "$what not ready after ${limit}s; see $S/logs/"
        fi
        sleep 0.3
    done
}

# start NAME BIN ARGS...: run a daemon in its own session (so a terminal's
# Ctrl-C does not reach it), log to logs/NAME.log, remember its pid.
start() {
    local name="$1"
    shift
    # 3>&-: the daemon must not hold up.sh's copy of stderr (a pipe reading
    # up.sh's output would never see its end).
    setsid "$@" >"$S/logs/$name.log" 2>&1 </dev/null 3>&- &
    echo "$!" >"$S/run/$name.pid"
    log "started $name (pid $!)"
}

# A daemon that exits during start-up is reported with its log tail instead of
# a time-out later.
alive() { # NAME
    local pid
    pid="$(cat "$S/run/$1.pid")"
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "up.sh: $1 exited; last lines of $S/logs/$1.log:" >&3
        tail -n 20 "$S/logs/$1.log" >&3
        exit 1
    fi
}
healthy() { # NAME URL...: the daemon is alive and the URL answers 2xx
    alive "$1"
    shift
    curl -fsS -o /dev/null --max-time 2 "$@"
}
status_server_answers() { # Trainer is alive and its status server answers (any status) over TLS
    alive trainer-controller-manager
    curl -sS -o /dev/null --max-time 2 --cacert "$S/pki/ca.crt" \
        --resolve "$TR_STATUS_HOST:$TR_STATUS_PORT:127.0.0.1" "https://$TR_STATUS_HOST:$TR_STATUS_PORT/"
}

# --- binaries ----------------------------------------------------------------
"$HERE/build.sh"
command -v kubectl >/dev/null || die "kubectl is not installed"
command -v openssl >/dev/null || die "openssl is not installed"
PY=python3
if [[ -x "$HERE/../../.venv/bin/python" ]]; then
    PY="$HERE/../../.venv/bin/python"
fi

# --- a clean state directory ---------------------------------------------------
# A previous cluster (or a half-started one) is stopped first, so every up is
# a fresh cluster on fresh ports.
"$HERE/down.sh" >/dev/null
# The state directory is removed whole: refuse one that up.sh did not make
# (DDPKIT_K8S_STATE pointing at a directory with other files in it).
if [[ -d "$S" && -n "$(ls -A "$S")" && ! -e "$S/kubeconfig" && ! -d "$S/run" ]]; then
    die "$S exists and is not a state directory of up.sh; set DDPKIT_K8S_STATE elsewhere"
fi
rm -rf "$S"
mkdir -p "$S/pki" "$S/logs" "$S/run" "$S/etcd" "$S/config" "$S/tmp/jobset" "$S/tmp/trainer"
chmod 700 "$S/pki"

# --- certificates ----------------------------------------------------------------
# One CA signs the API server's serving certificate, the admin client
# certificate and the webhook serving certificate. The CA also carries the DNS
# name `training-operator-ca`: the training operator's certificate rotator
# keeps a Secret's CA only if it verifies under that name, and otherwise
# would make its own certificates (for a Service name, not 127.0.0.1).
log "making certificates"
P="$S/pki"
# Keys are PKCS#1 ("RSA PRIVATE KEY", -traditional): the rotator parses the
# CA key of its Secret with x509.ParsePKCS1PrivateKey and rejects PKCS#8.
# RSA key generation is the slow part: all five keys at once.
for k in ca apiserver admin webhook sa; do
    openssl genrsa -traditional -out "$P/$k.key" 2048 2>/dev/null &
done
wait
openssl req -x509 -key "$P/ca.key" -days 3650 -out "$P/ca.crt" \
    -subj "/CN=ddpkit-local-ca" \
    -addext "subjectAltName=DNS:training-operator-ca" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature,keyEncipherment" 2>/dev/null
# sign NAME SUBJECT EXTENSIONS: a certificate for NAME.key signed by the CA,
# valid for 10 years (the rotator refreshes anything expiring within 90 days).
sign() {
    openssl req -new -key "$P/$1.key" -out "$P/$1.csr" -subj "$2" 2>/dev/null
    printf '%s\n' "$3" >"$P/$1.ext"
    openssl x509 -req -in "$P/$1.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial \
        -days 3650 -extfile "$P/$1.ext" -out "$P/$1.crt" 2>/dev/null
    rm -f "$P/$1.csr" "$P/$1.ext"
}
sign apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$SERVICE_APISERVER_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
sign admin "/O=system:masters/CN=ddpkit-admin" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
# The training operator's rotator checks the serving certificate against the
# Service name it would have had (training-operator.kubeflow.svc); the API
# server calls 127.0.0.1; pods call Trainer's status server by its Service name
# (Trainer serves it with this certificate). The certificate names all three.
sign webhook "/CN=ddpkit-local-webhooks" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:training-operator.kubeflow.svc,DNS:$TR_STATUS_HOST"
# Service-account tokens are signed with this key pair.
openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
# The training operator's rotator waits for the Secret's files in a fixed
# directory (/tmp/k8s-webhook-server/serving-certs in its source, where a
# kubelet would mount the Secret), and its webhook server reads them there.
TO_CERT_DIR=/tmp/k8s-webhook-server/serving-certs
to_ns=()
if [[ $(id -u) == 0 ]] && unshare --mount true 2>/dev/null; then
    # As root: the operator gets its own mount namespace with this cluster's copy at that
    # path, so a second cluster on the machine (DDPKIT_K8S_PORT_OFFSET) cannot overwrite
    # this one's certificate there (its webhook then failed with "unknown authority").
    mkdir -p /tmp/k8s-webhook-server
    TO_CERT_DIR="$S/tmp/training-operator/k8s-webhook-server/serving-certs"
    # shellcheck disable=SC2016  # $0/$@ expand in the inner shell
    to_ns=(unshare --mount --propagation private sh -c
        'mount --bind "$0" /tmp/k8s-webhook-server && exec "$@"' "${TO_CERT_DIR%/*}")
fi
mkdir -p "$TO_CERT_DIR"
cp "$P/webhook.crt" "$TO_CERT_DIR/tls.crt"
cp "$P/webhook.key" "$TO_CERT_DIR/tls.key"
cp "$P/ca.crt" "$TO_CERT_DIR/ca.crt"
# Trainer and JobSet read the serving certificate from
# $TMPDIR/k8s-webhook-server/serving-certs (controller-runtime's default);
# each gets its own TMPDIR so no two controllers share a directory.
for c in jobset trainer; do
    mkdir -p "$S/tmp/$c/k8s-webhook-server/serving-certs"
    cp "$P/webhook.crt" "$S/tmp/$c/k8s-webhook-server/serving-certs/tls.crt"
    cp "$P/webhook.key" "$S/tmp/$c/k8s-webhook-server/serving-certs/tls.key"
done
# Trainer's status server (TrainJobStatus, alpha in Trainer 2.3, off by default; on here unless
# DDPKIT_K8S_TRAINJOB_STATUS=0) needs what a pod would give it, at fixed paths of its source:
# its serving certificate in /tmp/k8s-webhook-server/serving-certs (not $TMPDIR's), and a
# service-account token in /var/run/secrets/kubernetes.io/serviceaccount, whose issuer it
# asks for the keys that verify the pods' tokens (at start: without them it exits). As root
# it gets its own mount namespace with this cluster's copies at those paths (the host's stay
# as they are; empty mount points are made where missing); without root the feature stays off.
TR_STATUS=0
TR_SA_DIR="$S/tmp/trainer/serviceaccount"
tr_ns=()
if [[ "${DDPKIT_K8S_TRAINJOB_STATUS:-1}" != 0 && $(id -u) == 0 ]] && unshare --mount true 2>/dev/null; then
    TR_STATUS=1
    mkdir -p "$TR_SA_DIR" /tmp/k8s-webhook-server /var/run/secrets/kubernetes.io/serviceaccount
    cp "$P/ca.crt" "$TR_SA_DIR/ca.crt"
    echo kubeflow-system >"$TR_SA_DIR/namespace"
    # shellcheck disable=SC2016  # $0/$1/$@ expand in the inner shell
    tr_ns=(unshare --mount --propagation private sh -c
        'mount --bind "$0" /tmp/k8s-webhook-server &&
         mount --bind "$1" /var/run/secrets/kubernetes.io/serviceaccount && shift && exec "$@"'
        "$S/tmp/trainer/k8s-webhook-server" "$TR_SA_DIR")
elif [[ "${DDPKIT_K8S_TRAINJOB_STATUS:-1}" != 0 ]]; then
    log "Trainer's TrainJobStatus stays off: its status server needs root here (a mount namespace)"
fi

# kubeconfig with embedded data so it can be copied elsewhere (written
# directly: four `kubectl config` runs cost seconds on a busy machine).
b64() { base64 -w0 "$1"; }
cat >"$KUBECONFIG_FILE" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ddpkit-local
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(b64 "$P/ca.crt")
users:
- name: ddpkit-admin
  user:
    client-certificate-data: $(b64 "$P/admin.crt")
    client-key-data: $(b64 "$P/admin.key")
contexts:
- name: ddpkit-local
  context:
    cluster: ddpkit-local
    user: ddpkit-admin
    namespace: default
current-context: ddpkit-local
EOF
chmod 600 "$KUBECONFIG_FILE"

# --- the controllers' manifests (in the background) ------------------------------
# Source trees of the controllers in the module cache (read-only), and their
# webhook configurations as each release ships them (kustomize of its
# manifests), re-pointed at 127.0.0.1. The training operator serves only
# PyTorchJob here, so only that webhook is kept (the others would refuse
# kinds that have no CRD anyway). Needs no server: runs while etcd and the
# API server start.
MODS="$S/config/modules.env"
(
    cd "$HERE/gomod/kubeflow"
    to_dir="$(k8s_mod_dir github.com/kubeflow/training-operator "$TRAINING_OPERATOR_VERSION")"
    js_dir="$(k8s_mod_dir sigs.k8s.io/jobset "$JOBSET_VERSION")"
    tr_dir="$(k8s_mod_dir github.com/kubeflow/trainer/v2 "$TRAINER_VERSION")"
    [[ -d "$to_dir" && -d "$js_dir" && -d "$tr_dir" ]] || exit 1
    printf 'TO_DIR=%q\nJS_DIR=%q\nTR_DIR=%q\n' "$to_dir" "$js_dir" "$tr_dir" >"$MODS"
    kubectl kustomize "$to_dir/manifests/base/webhook" |
        "$PY" "$HERE/webhooks.py" "$TO_WEBHOOK_PORT" "$P/ca.crt" --only pytorchjobs \
            >"$S/config/webhooks-training-operator.json"
    kubectl kustomize "$js_dir/config/components/webhook" |
        "$PY" "$HERE/webhooks.py" "$JS_WEBHOOK_PORT" "$P/ca.crt" --prefix jobset- \
            >"$S/config/webhooks-jobset.json"
    kubectl kustomize "$tr_dir/manifests/base/webhook" |
        "$PY" "$HERE/webhooks.py" "$TR_WEBHOOK_PORT" "$P/ca.crt" >"$S/config/webhooks-trainer.json"
) >"$S/logs/render.log" 2>&1 3>&- &
render_pid=$!

# --- etcd --------------------------------------------------------------------------
# A single member on loopback. --unsafe-no-fsync: a throw-away test cluster
# does not need durability, and fsync latency on shared disks slows writes.
start etcd "$ETCD_BIN" --name ddpkit --data-dir "$S/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "ddpkit=http://127.0.0.1:$ETCD_PEER_PORT" \
    --listen-metrics-urls "" --unsafe-no-fsync
wait_for 30 etcd healthy etcd "http://127.0.0.1:$ETCD_PORT/health"

# --- kube-apiserver ------------------------------------------------------------------
# --endpoint-reconciler-type=none: the `kubernetes` Service would get the
# advertise address as its endpoint, and a loopback endpoint is invalid.
# The service-account issuer is this server's own URL: Trainer's status server fetches the
# issuer's OIDC discovery document and keys from it (no cluster DNS here to resolve
# kubernetes.default.svc.cluster.local, nor a port 443).
start kube-apiserver "$APISERVER_BIN" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
    --tls-cert-file "$P/apiserver.crt" --tls-private-key-file "$P/apiserver.key" \
    --client-ca-file "$P/ca.crt" \
    --service-account-issuer "https://127.0.0.1:$API_PORT" \
    --service-account-key-file "$P/sa.pub" --service-account-signing-key-file "$P/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode RBAC --allow-privileged=true \
    --endpoint-reconciler-type none --profiling=false
wait_for 60 kube-apiserver alive kube-apiserver
wait_for 60 kube-apiserver kc get --raw /readyz
log "kube-apiserver ready ($(kc version -o json 2>/dev/null | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -n 1))"

# --- kube-controller-manager ------------------------------------------------------------
# The built-in controllers (Job -> Pods, garbage collector, service accounts,
# ...). The admin kubeconfig is enough on a local test cluster.
start kube-controller-manager "$KCM_BIN" \
    --kubeconfig "$KUBECONFIG_FILE" \
    --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
    --service-account-private-key-file "$P/sa.key" --root-ca-file "$P/ca.crt" \
    --cluster-signing-cert-file "$P/ca.crt" --cluster-signing-key-file "$P/ca.key" \
    --use-service-account-credentials=false --profiling=false

# --- CRDs, namespaces, webhook configurations ----------------------------------------------
# Wait for the manifests rendered while etcd and the API server started.
wait "$render_pid" || die "rendering the controllers' manifests failed"
TO_DIR="" JS_DIR="" TR_DIR="" # set by modules.env
# shellcheck source=/dev/null
. "$MODS"

log "installing CRDs, namespaces, webhook configurations"
# The namespaces the releases deploy into; the training operator keeps its
# certificate Secret in its own (MY_POD_NAMESPACE, default kubeflow), and its
# rotator accepts this one (see the certificates above) instead of making one.
# Trainer's Secret (its release's name) holds the CA that each TrainJob's pods get to trust
# its status server (a ConfigMap <job>-tls-config copied from its ca.crt); its ServiceAccount
# is the one whose token the status server reads (above).
cat >"$S/config/bootstrap.yaml" <<EOF
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Namespace, metadata: {name: kubeflow}}
- {apiVersion: v1, kind: Namespace, metadata: {name: kubeflow-system}}
- {apiVersion: v1, kind: Namespace, metadata: {name: jobset-system}}
- apiVersion: v1
  kind: Secret
  metadata: {name: kubeflow-trainer-webhook-cert, namespace: kubeflow-system}
  data:
    ca.crt: $(b64 "$P/ca.crt")
    tls.crt: $(b64 "$P/webhook.crt")
    tls.key: $(b64 "$P/webhook.key")
- {apiVersion: v1, kind: ServiceAccount, metadata: {name: kubeflow-trainer-controller-manager, namespace: kubeflow-system}}
- apiVersion: v1
  kind: Secret
  metadata: {name: training-operator-webhook-cert, namespace: kubeflow}
  data:
    ca.crt: $(b64 "$P/ca.crt")
    ca.key: $(b64 "$P/ca.key")
    tls.crt: $(b64 "$P/webhook.crt")
    tls.key: $(b64 "$P/webhook.key")
EOF
# One server-side apply (the CRDs are too large for client-side apply's
# last-applied annotation). The webhook configurations go in before the
# controllers start: the training operator's rotator looks its one up by name.
kc apply --server-side --force-conflicts \
    -f "$TO_DIR/manifests/base/crds/kubeflow.org_pytorchjobs.yaml" \
    -f "$JS_DIR/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" \
    -f "$TR_DIR/manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml" \
    -f "$TR_DIR/manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml" \
    -f "$TR_DIR/manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml" \
    -f "$S/config/bootstrap.yaml" \
    -f "$S/config/webhooks-training-operator.json" -f "$S/config/webhooks-jobset.json" \
    -f "$S/config/webhooks-trainer.json" >/dev/null
kc wait --for condition=Established --timeout=60s \
    crd/pytorchjobs.kubeflow.org crd/jobsets.jobset.x-k8s.io crd/trainjobs.trainer.kubeflow.org \
    crd/trainingruntimes.trainer.kubeflow.org crd/clustertrainingruntimes.trainer.kubeflow.org >/dev/null

# --- controllers -------------------------------------------------------------------------
# Leader election off (one replica); metrics off ("0") so no port is taken.
# Training operator v1.9: flags only; its cert rotator checks the Secret above
# and the files in /tmp/k8s-webhook-server/serving-certs, and keeps the
# caBundle of validator.training-operator.kubeflow.org up to date.
NODES="${DDPKIT_K8S_NODES:-0}"
to_args=()
if ((NODES > 0)); then
    # Worker pods get an init container that waits for the master's name with
    # nslookup, which asks a DNS server; the node agent has none (names go to
    # a hosts file), so locally the same loop uses getent, which reads it.
    # Only the init container's command differs from the operator's default.
    cat >"$S/config/pytorch-init-container.yaml" <<'EOF'
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits:
      cpu: 100m
      memory: 20Mi
    requests:
      cpu: 50m
      memory: 10Mi
  command: ['sh', '-c', 'err=1;for i in $(seq {{.MaxTries}}); do if getent hosts {{.MasterAddr}}; then err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err']
EOF
    to_args=(--pytorch-init-container-template-file "$S/config/pytorch-init-container.yaml")
fi
# TMPDIR=/tmp: its webhook server looks in $TMPDIR/k8s-webhook-server/...,
# the rotator in /tmp/k8s-webhook-server/...; they must agree.
start training-operator "${to_ns[@]}" env KUBECONFIG="$KUBECONFIG_FILE" MY_POD_NAMESPACE=kubeflow TMPDIR=/tmp \
    "$TRAINING_OPERATOR_BIN" --enable-scheme=pytorchjob \
    --webhook-server-port "$TO_WEBHOOK_PORT" \
    --metrics-bind-address 0 --health-probe-bind-address "127.0.0.1:$TO_HEALTH_PORT" \
    "${to_args[@]}"

cat >"$S/config/jobset.yaml" <<EOF
apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
webhook:
  port: $JS_WEBHOOK_PORT
  certDir: $S/tmp/jobset/k8s-webhook-server/serving-certs
internalCertManagement:
  enable: false
EOF
start jobset-controller env KUBECONFIG="$KUBECONFIG_FILE" TMPDIR="$S/tmp/jobset" \
    "$JOBSET_BIN" --config "$S/config/jobset.yaml" \
    --metrics-bind-address 0 --health-probe-bind-address "127.0.0.1:$JS_HEALTH_PORT"

cat >"$S/config/trainer.yaml" <<EOF
apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
health:
  healthProbeBindAddress: 127.0.0.1:$TR_HEALTH_PORT
  readinessEndpointName: readyz
  livenessEndpointName: healthz
metrics:
  bindAddress: "0"
webhook:
  port: $TR_WEBHOOK_PORT
leaderElection:
  leaderElect: false
certManagement:
  enable: false
EOF
if ((TR_STATUS)); then
    # The token only names the issuer to the status server (it reads its `iss`); the
    # status server then verifies the pods' tokens with the issuer's keys.
    kc create token kubeflow-trainer-controller-manager -n kubeflow-system --duration 24h \
        >"$TR_SA_DIR/token"
    cat >>"$S/config/trainer.yaml" <<EOF
featureGates:
  TrainJobStatus: true
statusServer:
  port: $TR_STATUS_PORT
EOF
fi
start trainer-controller-manager "${tr_ns[@]}" env KUBECONFIG="$KUBECONFIG_FILE" TMPDIR="$S/tmp/trainer" \
    "$TRAINER_BIN" --config "$S/config/trainer.yaml"

# readyz of each controller turns true once its webhook server listens.
wait_for 60 training-operator healthy training-operator "http://127.0.0.1:$TO_HEALTH_PORT/readyz"
wait_for 60 jobset-controller healthy jobset-controller "http://127.0.0.1:$JS_HEALTH_PORT/readyz"
wait_for 60 trainer-controller-manager healthy trainer-controller-manager "http://127.0.0.1:$TR_HEALTH_PORT/readyz"
if ((TR_STATUS)); then
    # Any answer over TLS with the name the pods use (its 404 for /) means it serves; it
    # starts once it has the issuer's keys.
    wait_for 60 "Trainer's status server" status_server_answers
fi
alive kube-controller-manager
log "controllers ready"

# --- runtimes ----------------------------------------------------------------------------
# Trainer's own torch-distributed ClusterTrainingRuntime, admitted through its
# webhook (retried: the webhook may answer a moment after readyz).
wait_for 30 "torch-distributed ClusterTrainingRuntime" \
    kc apply --server-side -f "$TR_DIR/manifests/base/runtimes/torch_distributed.yaml"

# --- node agent (optional) ---------------------------------------------------------------
# DDPKIT_K8S_NODES=N registers N nodes served by node_agent.py (nodeagent/; pods run as
# local processes); 0 (the default) leaves pods Pending, as without kubelets.
if ((NODES > 0)); then
    "$PY" -c "import kubernetes" 2>/dev/null || die "node agent needs the kubernetes package (make setup)"
    # --hosts-file only when asked: it edits that file (e.g. /etc/hosts).
    hosts_args=()
    if [[ -n "${DDPKIT_K8S_HOSTS_FILE:-}" ]]; then
        hosts_args=(--hosts-file "$DDPKIT_K8S_HOSTS_FILE")
    fi
    # Images the pods name -> local Python environments (PATTERN=VENV[:WORKSPACE], space
    # separated); the default maps ddpkit:* to the venv that runs the agent.
    # (read -ra: split on blanks without expanding the patterns' `*` as file names)
    image_args=() images=()
    read -ra images <<<"${DDPKIT_K8S_IMAGES:-}"
    for m in "${images[@]}"; do
        image_args+=(--image "$m")
    done
    # The status server's name stands for this host, where Trainer serves it.
    if ((TR_STATUS)); then
        hosts_args+=(--host-name "$TR_STATUS_HOST")
    fi
    start node-agent "$PY" "$HERE/node_agent.py" --kubeconfig "$KUBECONFIG_FILE" \
        --state "$S/node" --nodes "$NODES" --port "$KUBELET_PORT" --tls-cert "$P/webhook.crt" --tls-key "$P/webhook.key" \
        --network "${DDPKIT_K8S_NETWORK:-netns}" --bridge "${DDPKIT_K8S_BRIDGE:-ddpkit0}" \
        --pod-cidr "${DDPKIT_K8S_POD_CIDR:-10.244.0.0/24}" "${hosts_args[@]}" "${image_args[@]}"
    wait_for 30 "node agent" kc wait --for condition=Ready --timeout=1s node --all
    log "$NODES node(s) Ready"
fi

log "up: export KUBECONFIG=$KUBECONFIG_FILE (logs in $S/logs)"
