#!/usr/bin/env bash
# Start a real SLURM cluster of N "nodes" on this one machine (default 2): slurmctld plus one
# slurmd per node, all on 127.0.0.1 with their own ports, sharing this filesystem like a
# cluster with a shared home. Installs Debian's slurm-wlm and munge when missing (root).
#
# It will not touch a machine that already runs a slurmctld it did not start, unless asked:
#   DDPKIT_SLURM_FORCE=1 bash slurm/local/up.sh 2
# Each node advertises "gpu" GRES backed by placeholder device files (copies of /dev/null;
# SLURM 22.05 does not count GPUs without files), so job scripts that request
# --gpus-per-node schedule exactly as on a GPU cluster; torch then finds no CUDA and uses gloo.
set -euo pipefail

nodes=${1:-2}
cpus=${DDPKIT_SLURM_CPUS:-8}    # advertised per node (oversubscribed: the machine may have fewer)
gpus=${DDPKIT_SLURM_GPUS:-4}    # placeholder GPUs per node (1-9)
conf_dir=/etc/slurm
marker="# ddpkit local cluster"

die() { echo "slurm-up: $*" >&2; exit 1; }
[[ $nodes =~ ^[1-9][0-9]?$ ]] || die "NODES must be 1-99, got '$nodes'"
[[ $gpus =~ ^[1-9]$ ]] || die "DDPKIT_SLURM_GPUS must be 1-9, got '$gpus'"
[ "$(id -u)" = 0 ] || die "needs root (it installs packages and starts daemons); run it as root"

ours() { [ -f "$conf_dir/slurm.conf" ] && head -n 1 "$conf_dir/slurm.conf" | grep -qF "$marker"; }
# Nodes that answer (no "*" in their state) and can run jobs.
ready_nodes() { sinfo -h -N -t idle,mixed,alloc,completing -o "%N %t" 2>/dev/null | grep -v '\*' | sort -u | wc -l; }

# The node names (node1, node2, ...) deliberately do not resolve as host names, as on
# clusters whose NodeName is not a DNS name: jobs must find the head by its NodeAddr.
# (Earlier versions of this script added them to /etc/hosts: take that line out.)
if grep -q "ddpkit-slurm" /etc/hosts 2>/dev/null; then
    sed "/ddpkit-slurm/d" /etc/hosts >/etc/hosts.ddpkit && cat /etc/hosts.ddpkit >/etc/hosts
    rm -f /etc/hosts.ddpkit
fi

# The node count the running cluster was started with (0: none of ours).
configured() { ours && sed -n 's/^# nodes=\([0-9]*\)$/\1/p' "$conf_dir/slurm.conf" | head -n 1 || echo 0; }
grow=0
if pgrep -x slurmctld >/dev/null; then
    if ! ours && [ "${DDPKIT_SLURM_FORCE:-0}" != 1 ]; then
        die "a slurmctld that ddpkit did not start is running; refusing to touch it (set DDPKIT_SLURM_FORCE=1 to replace its config)"
    fi
    have=$(configured)
    # At least N nodes answer: that is a cluster of N for every caller (a 2-node test runs on
    # a 3-node cluster), so one asking for fewer never restarts it under another's jobs.
    if ours && [ "${have:-0}" -ge "$nodes" ] && [ "$(ready_nodes)" -ge "$nodes" ]; then
        echo "slurm-up: local cluster already up ($have nodes)"; sinfo; exit 0
    fi
    if ours && [ "${have:-0}" -ge 1 ] && [ "${have:-0}" -lt "$nodes" ] && [ "$(ready_nodes)" -ge "$have" ]; then
        # More nodes asked of a healthy cluster: added in place. slurmctld restarts from its
        # saved state (no -c) and the running slurmds are restarted on the new config; job
        # steps are slurmstepd's and outlive both, so the jobs running now go on.
        echo "slurm-up: growing the local cluster from $have to $nodes nodes (running jobs stay)"
        grow=1
    else
        echo "slurm-up: restarting the local cluster with $nodes nodes"
        bash "$(dirname "$0")/down.sh"
    fi
fi
if [ -f "$conf_dir/slurm.conf" ] && ! ours && [ "${DDPKIT_SLURM_FORCE:-0}" != 1 ]; then
    die "$conf_dir/slurm.conf exists and is not ddpkit's; refusing to overwrite it (DDPKIT_SLURM_FORCE=1 to replace it)"
fi

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    echo "slurm-up: installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 || {
        apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null
    } || die "apt-get install slurm-wlm munge failed"
fi

# munge: every daemon and client authenticates through it.
mkdir -p /run/munge /etc/munge /var/log/munge /var/lib/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown -R munge:munge /run/munge /etc/munge /var/log/munge /var/lib/munge
chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c "munged --force"

host=$(hostname)
mkdir -p "$conf_dir" /var/spool/slurmctld /var/log/slurm
node_names=""
for i in $(seq 1 "$nodes"); do node_names+="node$i "; mkdir -p "/var/spool/slurmd/node$i"; done
node_names=${node_names% }

tmp=$(mktemp "$conf_dir/slurm.conf.XXXX")
{
    echo "$marker (slurm/local/up.sh); nodes=$nodes"
    echo "# nodes=$nodes"
    cat <<CONF
ClusterName=ddpkit
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=60
StateSaveLocation=/var/spool/slurmctld
SlurmctldPidFile=/run/slurmctld.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmdPidFile=/run/slurmd-%n.pid
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
CONF
    for i in $(seq 1 "$nodes"); do
        echo "NodeName=node$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((17000 + i)) CPUs=$cpus RealMemory=16000 Gres=gpu:$gpus State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE OverSubscribe=YES State=UP"
} >"$tmp"
chmod 0644 "$tmp"
mv "$tmp" "$conf_dir/slurm.conf"
fake=/dev/ddpkit-fake-gpu
mkdir -p "$fake"
for i in $(seq 0 $((gpus - 1))); do
    [ -c "$fake/$i" ] || mknod "$fake/$i" c 1 3  # same device numbers as /dev/null
done
printf 'AutoDetect=off\nName=gpu File=%s/[0-%d]\n' "$fake" $((gpus - 1)) >"$conf_dir/gres.conf"
# proctrack/linuxproc and task/none need no cgroups (22.05 has no "disabled" cgroup plugin).
rm -f "$conf_dir/cgroup.conf"

if [ "$grow" = 1 ]; then
    scontrol shutdown slurmctld >/dev/null 2>&1 || true
    for _ in $(seq 1 30); do pgrep -x slurmctld >/dev/null || break; sleep 1; done
    slurmctld  # its saved state: the jobs it ran are its jobs again
    for i in $(seq 1 "$nodes"); do
        pidfile=/run/slurmd-node$i.pid
        if [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null; then
            for _ in $(seq 1 30); do kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null || break; sleep 0.2; done
        fi
        slurmd -N "node$i"
    done
else
    slurmctld -c  # -c: no state from an earlier cluster (old jobs, nodes marked invalid)
    for i in $(seq 1 "$nodes"); do slurmd -N "node$i"; done
fi

for _ in $(seq 1 60); do
    if [ "$(ready_nodes)" -ge "$nodes" ]; then
        echo "slurm-up: $nodes nodes up"; sinfo; exit 0
    fi
    sleep 1
done
sinfo || true
die "nodes did not come up within 60 s; see /var/log/slurm/"
