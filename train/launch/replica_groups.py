"""The replica-group supervisor of a torchft job on one machine (`fault_tolerance = "torchft"`).

    python -m ddpkit.train.replica_groups --groups 2 --run-dir runs/x -- NODE_LAUNCHER_ARGV...

Starts torchft's lighthouse, then one node launcher (one torchrun) per replica group, each
with the command line it was given, as given, and in the environment its identity, the
lighthouse's address and its own dirs (train/ft_env.py): the run dir `<run dir>/group-<g>`
and the checkpoint dir `<ckpt dir>/group-<g>` (`--run-dir`, `--ckpt-dir`: the job's; the
node launcher and the trainer take a group's dirs over their flags). A group that dies
is started again while the others keep training (it heals from a live peer at its first
quorum); a group's bad input (exit 2) stops the job at once (never retried). A stop signal
(Ctrl-C, SIGTERM, ...) goes to every group; no group is restarted after it, and the
lighthouse ends last. `<run dir>/replica_groups.json` says where each group is: its pid, its
restarts and the exit statuses so far.

On a cluster (`--nodes N`, SLURM: one supervisor per node) each node runs its own share of
the groups (one per node by default) and restarts them in place; the node of rank 0 (read
from `--node-rank-env`, default the contract's DDPKIT_NODE_NUMBER, which each engine binds)
also runs the lighthouse, at the address every node
finds in TORCHFT_LIGHTHOUSE (the node script sets it: the head node, the job's port), unless
`--no-lighthouse` (Kubernetes runs it as its own pod, behind a Service). Each
node writes its own status file, `replica_groups.node-<rank>.json`, stamped with the launch
(DDPKIT_LAUNCH_ID). Where the run dir is shared (SLURM), the nodes read each other's: once the
run finished on one node's groups, the others restart none of theirs (a group still rejoining
has no live peer to heal from), and the node that finished stays in the job step until the
other nodes' groups have ended: srun kills the tasks left `--wait` seconds after the first one
exits, and that kill would read as a lost node and requeue a finished job.

Torch-free: the node launchers import torch; this process only watches them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddpkit.train.contract import (
    CKPT_DIR_ENV,
    EXIT_BAD_INPUT,
    LAUNCH_ID_ENV,
    NODE_NUMBER_ENV,
    RUN_DIR_ENV,
    STOP_SIGNALS,
    default_ckpt_dir,
    launch_record,
)
from ddpkit.train.ft_env import LIGHTHOUSE_ENV, ReplicaGroup, group_dir
from ddpkit.train.launch import lighthouse

STATUS_FILE = "replica_groups.json"
RESTART_DELAY_S = 1.0
# Once a group has finished the run, the others (in lockstep) end within a step, a save and an
# evaluation; a group still rejoining then has no live peer to heal from: it is stopped.
FINISH_GRACE_S = 60.0
# On a cluster: how often a node reads the others' status files, and how long a node whose
# groups finished waits for the others' to end (a rejoining group's grace, then its stop).
PEER_POLL_S = 1.0
PEER_END_WAIT_S = FINISH_GRACE_S + 60.0
FORWARDED = tuple(getattr(signal, name) for name in (*STOP_SIGNALS, "SIGHUP"))


def group_env(group: int, run_dir: str, ckpt_dir: str | None) -> dict[str, str]:
    """One group's dirs in the contract's names (ft_env.group_dirs reads them): its own run
    dir below the job's, and its checkpoint dir below the job's (else below its run dir).
    Every group's launcher wrote its goodput records into the job's dir before they had
    their own, and each counted the others' attempts as its own restarts."""
    own = group_dir(run_dir, group)
    ckpt = group_dir(ckpt_dir, group) if ckpt_dir else default_ckpt_dir(own)
    return {RUN_DIR_ENV: own, CKPT_DIR_ENV: ckpt}


def status_name(nodes: int, node_rank: int) -> str:
    return STATUS_FILE if nodes == 1 else f"replica_groups.node-{node_rank}.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class Supervisor:
    def __init__(self, args: argparse.Namespace, node_argv: list[str], node_rank: int = 0) -> None:
        self.args, self.node_argv, self.node_rank = args, node_argv, node_rank
        self.run_dir = Path(args.run_dir)
        per_node = args.groups // args.nodes
        self.groups = list(range(node_rank * per_node, (node_rank + 1) * per_node))
        self.status_file = status_name(args.nodes, node_rank)
        # this launch's stamp on the status file: the other nodes read only this launch's
        self.launch_id = os.environ.get(LAUNCH_ID_ENV) or None
        self.since = time.time()
        self.lighthouse: subprocess.Popen | None = None
        self.lighthouse_restarts = 0
        self.procs: dict[int, subprocess.Popen] = {}
        self.restarts = dict.fromkeys(self.groups, 0)
        self.exits: dict[int, list[int]] = {g: [] for g in self.groups}
        self.done: dict[int, int] = {}  # group -> its final exit status
        self.stopping = False
        self.signalled = False  # a stop signal came from outside (a cancel, a preemption)
        self.lock = threading.Lock()  # the output lines of the groups' reader threads

    # --- the lighthouse ----------------------------------------------------------------------

    def find_lighthouse(self) -> str:
        """On a cluster: the lighthouse's address (TORCHFT_LIGHTHOUSE); node 0 starts it, the
        others wait until it listens."""
        address = os.environ.get(LIGHTHOUSE_ENV, "")
        host, _, port = address.removeprefix("http://").rpartition(":")
        if not host or not port.isdigit():
            raise SystemExit(
                f"ddpkit replica groups: --nodes {self.args.nodes} needs {LIGHTHOUSE_ENV}="
                f"http://HOST:PORT (the node script sets it); got {address!r}"
            )
        if self.node_rank == 0 and not self.args.no_lighthouse:
            self.start_lighthouse(int(port))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
                return address
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"ddpkit replica groups: the lighthouse at {address} did not answer")

    def start_lighthouse(self, port: int = 0) -> str:
        if importlib.util.find_spec("torchft") is None:
            raise SystemExit(
                "ddpkit replica groups: torchft is not installed: pip install 'ddpkit[ft]' "
                "(torchft) into the environment that runs the job"
            )
        port = port or self.args.lighthouse_port or free_port()
        self.lighthouse = subprocess.Popen(
            [sys.executable, "-m", "ddpkit.train.launch.lighthouse", *lighthouse.flags(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.lighthouse.poll() is not None:
                raise SystemExit(
                    f"ddpkit replica groups: the lighthouse exited ({self.lighthouse.returncode}) "
                    f"at start-up; is port {port} in use?"
                )
            try:
                socket.create_connection(("localhost", port), timeout=1).close()
                return f"http://{socket.gethostname()}:{port}"
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"ddpkit replica groups: the lighthouse did not listen on {port}")

    def restart_lighthouse(self, code: int | None) -> None:
        """The lighthouse died (killed, crashed): start it again at the same address, so the
        groups' managers find it where they look and go on. Before, the supervisor stopped
        every group: none had saved, and the rerun started from step 0. After
        --max-group-restarts of its own, the groups are stopped as then."""
        self.lighthouse_restarts += 1
        budget = self.args.max_group_restarts
        port = int(self.address.rpartition(":")[2])
        if self.lighthouse_restarts > budget:
            self.say(f"the lighthouse exited ({code}) {budget + 1} times; stopping")
            self.stop(signal.SIGTERM)
            return
        try:
            self.start_lighthouse(port)
        except SystemExit as e:
            self.say(f"the lighthouse exited ({code}) and did not start again ({e}); stopping")
            self.stop(signal.SIGTERM)
            return
        self.say(
            f"the lighthouse exited ({code}); started again on port {port} "
            f"({self.lighthouse_restarts} of {budget}): the groups go on"
        )

    # --- the groups -------------------------------------------------------------------------

    def start(self, g: int) -> None:
        env = {**os.environ, **ReplicaGroup(g, self.args.groups, self.address).env()}
        env.setdefault("RUST_LOG", "warn")  # torchft's manager logs every quorum at info
        # torchrun gives each rank one intra-op thread when it starts several, but a group of
        # one rank would get a thread per core: with the other groups on the same cores, that
        # oversubscription cost 172 ms a step against 16 ms (bench/torchft_overhead.py).
        env.setdefault("OMP_NUM_THREADS", "1")
        env.update(group_env(g, self.args.run_dir, self.args.ckpt_dir))
        proc = subprocess.Popen(
            self.node_argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.procs[g] = proc
        threading.Thread(target=self._relay, args=(g, proc), daemon=True).start()
        self.write_status()

    def _relay(self, g: int, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, b""):
            with self.lock:
                sys.stdout.buffer.write(f"[group {g}] ".encode() + line)
                sys.stdout.flush()

    def say(self, msg: str) -> None:
        with self.lock:
            print(f"ddpkit replica groups: {msg}", flush=True)

    def write_status(self) -> None:
        status = {
            "launch_id": self.launch_id,
            "time": time.time(),
            "node": self.node_rank,
            "finished": 0 in self.done.values(),  # a group here ended the run
            "lighthouse": self.address,
            "groups": [
                {
                    "group": g,
                    "pid": self.procs[g].pid if g in self.procs else None,
                    "running": g in self.procs and g not in self.done,
                    "restarts": self.restarts[g],
                    "exits": self.exits[g],
                }
                for g in self.groups
            ],
        }
        path = self.run_dir / self.status_file
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(status, indent=2) + "\n")
        os.replace(tmp, path)

    def peers(self) -> list[dict]:
        """The other nodes' status files of this launch: none where each node has a run dir
        of its own (Kubernetes without a claim), and then each node ends on its own."""
        found = []
        for r in range(self.args.nodes):
            if r != self.node_rank:
                path = self.run_dir / status_name(self.args.nodes, r)
                body = launch_record(path, self.launch_id, self.since)
                if body is not None:
                    found.append(body)
        return found

    def await_peers(self) -> None:
        """The run finished and this node's groups have ended: stay in the job step until the
        other nodes' groups have ended too (at most PEER_END_WAIT_S), so that srun's --wait,
        which starts when the first node's task exits, does not kill a node still stopping a
        rejoining group. The lighthouse stops first: a group still rejoining finds no quorum
        and ends, instead of training on alone from its own step."""
        if self.lighthouse is not None and self.lighthouse.poll() is None:
            self.lighthouse.terminate()
            self.lighthouse.wait()
        deadline = time.monotonic() + PEER_END_WAIT_S
        said = False
        while not self.signalled:
            busy = [
                str(p.get("node"))
                for p in self.peers()
                if any(g.get("running") for g in p.get("groups") or [])
            ]
            if not busy:
                return
            if time.monotonic() > deadline:
                self.say(f"node(s) {', '.join(busy)} still running after {PEER_END_WAIT_S:g} s")
                return
            if not said:
                said = True
                self.say(f"the run finished; waiting for node(s) {', '.join(busy)} to end")
            time.sleep(PEER_POLL_S)

    def on_signal(self, signum: int, _frame: object = None) -> None:
        self.signalled = True
        self.stop(signum)

    def stop(self, signum: int, _frame: object = None) -> None:
        self.stopping = True
        for g, proc in self.procs.items():
            if g not in self.done and proc.poll() is None:
                proc.send_signal(signum)

    def watch(self) -> int:
        """Until every group has ended for good: restart the ones that die."""
        finished_at = None
        next_poll = 0.0
        while len(self.done) < len(self.groups):
            time.sleep(0.2)
            if finished_at is None and 0 in self.done.values():
                finished_at = time.monotonic()
            if finished_at is None and self.args.nodes > 1 and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + PEER_POLL_S
                ended = [str(p.get("node")) for p in self.peers() if p.get("finished")]
                if ended:
                    finished_at = time.monotonic()
                    self.say(
                        f"the run finished on node {ended[0]}'s groups; a group here that ends "
                        "is not restarted (nothing left to heal from)"
                    )
            late = finished_at is not None and time.monotonic() - finished_at > FINISH_GRACE_S
            if late and not self.stopping:
                left = sorted(set(self.groups) - set(self.done))
                self.say(
                    f"the run finished on other groups {FINISH_GRACE_S:g} s ago; stopping "
                    f"group(s) {', '.join(map(str, left))} (still rejoining, nothing to heal from)"
                )
                self.stop(signal.SIGTERM)
            lighthouse = self.lighthouse
            if lighthouse is not None and lighthouse.poll() is not None and not self.stopping:
                self.restart_lighthouse(lighthouse.returncode)
            for g, proc in list(self.procs.items()):
                rc = proc.poll()
                if g in self.done or rc is None:
                    continue
                self.exits[g].append(rc)
                # after a group finished, the run is over: a dead group is not started again
                retry = rc not in (0, EXIT_BAD_INPUT) and not self.stopping and not finished_at
                if retry and self.restarts[g] < self.args.max_group_restarts:
                    self.restarts[g] += 1
                    self.say(
                        f"group {g} exited ({rc}); restarting it ({self.restarts[g]} of "
                        f"{self.args.max_group_restarts}) while the others train"
                    )
                    time.sleep(RESTART_DELAY_S)
                    self.start(g)
                    continue
                if finished_at is not None and rc != 0 and not self.stopping:
                    self.say(f"group {g} exited ({rc}) after the run finished; not restarted")
                self.done[g] = rc
                self.write_status()
                if rc == EXIT_BAD_INPUT and not self.stopping:
                    self.stop(signal.SIGTERM)
        if self.args.nodes > 1 and (finished_at is not None or 0 in self.done.values()):
            self.await_peers()
        codes = [self.done[g] for g in self.groups]
        if finished_at is not None and EXIT_BAD_INPUT not in codes:
            return 0  # the run finished on the groups that were live at its end
        return next((c for c in codes if c == EXIT_BAD_INPUT), None) or next(
            (c for c in codes if c != 0), 0
        )

    def run(self) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.address = self.start_lighthouse() if self.args.nodes == 1 else self.find_lighthouse()
        previous = {s: signal.signal(s, self.on_signal) for s in FORWARDED}
        try:
            mine = ", ".join(map(str, self.groups))
            where = "" if self.args.nodes == 1 else f" (node {self.node_rank} runs {mine})"
            self.say(
                f"lighthouse at {self.address}; {self.args.groups} replica groups{where}, each "
                f"restarted up to {self.args.max_group_restarts} times"
            )
            for g in self.groups:
                self.start(g)
            return self.watch()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
            if self.lighthouse is not None:
                self.lighthouse.terminate()
                self.lighthouse.wait()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ddpkit.train.replica_groups", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--groups", type=int, required=True, help="replica groups (>= 2)")
    p.add_argument("--run-dir", required=True, help="the job's run dir (groups: group-<g>/)")
    p.add_argument("--ckpt-dir", help="the job's checkpoint dir, when not the run dir's")
    p.add_argument("--lighthouse-port", type=int, default=0, help="default: a free port")
    p.add_argument("--max-group-restarts", type=int, default=10, help="per group")
    p.add_argument(
        "--nodes", type=int, default=1, help="one supervisor per node, each its share of groups"
    )
    p.add_argument(
        "--node-rank-env",
        default=NODE_NUMBER_ENV,
        help="with --nodes: the variable that holds this node's rank (default: %(default)s)",
    )
    p.add_argument(
        "--no-lighthouse",
        action="store_true",
        help="with --nodes: the lighthouse runs elsewhere (Kubernetes: its own pod)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("error: give the node launcher's command after `--`", file=sys.stderr)
        return EXIT_BAD_INPUT
    i = argv.index("--")
    args = build_parser().parse_args(argv[:i])
    if args.groups < 2:
        print(f"error: --groups {args.groups}: torchft needs at least 2", file=sys.stderr)
        return EXIT_BAD_INPUT
    node_rank = 0
    if args.nodes > 1:
        try:
            node_rank = int(os.environ.get(args.node_rank_env, ""))
        except ValueError:
            node_rank = -1
        if args.groups % args.nodes or not 0 <= node_rank < args.nodes:
            print(
                f"error: --nodes {args.nodes}: needs a group count it divides (got "
                f"{args.groups}) and ${args.node_rank_env} in 0..{args.nodes - 1} (got "
                f"{os.environ.get(args.node_rank_env)!r})",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
    return Supervisor(args, argv[i + 1 :], node_rank).run()


if __name__ == "__main__":
    sys.exit(main())
