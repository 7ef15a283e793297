#!/usr/bin/env bash
# Stop the local SLURM cluster that slurm/local/up.sh started (and only that one).
set -euo pipefail

conf=/etc/slurm/slurm.conf
if [ ! -f "$conf" ] || ! head -n 1 "$conf" | grep -qF "# ddpkit local cluster"; then
    if pgrep -x slurmctld >/dev/null; then
        echo "slurm-down: the running slurmctld was not started by ddpkit; leaving it alone" >&2
        exit 1
    fi
    echo "slurm-down: no local cluster running"; exit 0
fi
scontrol shutdown >/dev/null 2>&1 || true
for _ in $(seq 1 30); do
    pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || { echo "slurm-down: stopped"; exit 0; }
    sleep 1
done
# Daemons that ignored the shutdown: stop them by their pid files.
for pidfile in /run/slurmctld.pid /run/slurmd-*.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
done
echo "slurm-down: stopped"
