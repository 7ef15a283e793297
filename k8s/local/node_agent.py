"""A small node agent for the local control plane, in place of a kubelet.

It registers Ready nodes (cpu, memory, pods and nvidia.com/gpu advertised),
binds pending pods to them (there is no scheduler), runs each pod's containers
as local processes standing in for the image (command + args, env incl.
fieldRef / Secret / ConfigMap references, workingDir), reports phase, container
states, pod IP and exit codes, serves container logs to `kubectl logs` (the API
server asks the node's kubelet port for them), and on delete sends SIGTERM,
waits the pod's grace period, then SIGKILL.

A container runs in its own mount and UTS namespace (and, with --network netns,
the pod's network namespace on a bridge): the image is a local Python
environment (--image PATTERN=VENV[:WORKSPACE]: VENV/bin first on PATH, WORKSPACE
copied to /workspace), volumes are local dirs bind-mounted at their mountPaths
(PVC: a dir per claim under the state dir; emptyDir: per pod, medium Memory in
/dev/shm; hostPath: itself), /etc/hosts is the agent's file of pod and Service
names -> pod IPs, and the command runs as the securityContext's user where that
user can start the environment's Python (else as root, with a warning).

What a kubelet does and this does not: real images, resource limits, probes,
DNS, PVC binding, node-selector / affinity / taint checks when binding.

usage: python node_agent.py --kubeconfig K [--nodes 2] [--gpus 8] [--state DIR]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import fnmatch
import http.server
import ipaddress
import logging
import os
import re
import shlex
import shutil
import signal
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass

from kubernetes import client, config
from kubernetes.client.rest import ApiException

log = logging.getLogger("node-agent")
HOSTS_BEGIN = "# BEGIN ddpkit-node-agent"
HOSTS_END = "# END ddpkit-node-agent"


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Image:
    """What stands in for an image here: a Python environment whose bin/ goes first on
    PATH (as the image's PATH would put its interpreter first) and, optionally, a
    directory whose contents play the image's working directory (a derived user image's
    code), copied per pod so a pod's writes never reach it."""

    pattern: str
    venv: str | None
    workspace: str | None = None
    workdir: str = "/workspace"

    @classmethod
    def parse(cls, text: str) -> Image:
        """PATTERN=VENV[:WORKSPACE] (PATTERN an fnmatch pattern of image names)."""
        pattern, sep, rest = text.partition("=")
        if not sep or not pattern or not rest:
            raise argparse.ArgumentTypeError(f"--image {text!r}: want PATTERN=VENV[:WORKSPACE]")
        venv, _, workspace = rest.partition(":")
        return cls(
            pattern, os.path.abspath(venv), os.path.abspath(workspace) if workspace else None
        )

    def path(self) -> str:
        return f"{self.venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Network:
    """Pod addresses. netns: a bridge on the host and one network namespace per pod
    (veth pair, an address from the pod CIDR), so pods of one node may listen on one
    port; host: every pod on the host's network at 127.0.0.1."""

    def __init__(self, mode: str, bridge: str, cidr: str):
        self.mode, self.bridge = mode, bridge
        self.net = ipaddress.ip_network(cidr)
        hosts = [str(h) for h in self.net.hosts()]
        self.gateway, self.free = hosts[0], hosts[1:]
        self.lock = threading.Lock()

    @staticmethod
    def ip(*args: str, check: bool = True) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        if check and r.returncode:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def up(self) -> None:
        if self.mode != "netns":
            return
        self.down()
        self.ip("link", "add", self.bridge, "type", "bridge")
        self.ip("addr", "add", f"{self.gateway}/{self.net.prefixlen}", "dev", self.bridge)
        self.ip("link", "set", self.bridge, "up")
        log.info("pod network %s on bridge %s (one netns per pod)", self.net, self.bridge)

    def down(self) -> None:
        """The bridge and every pod namespace of this bridge (also a crashed agent's)."""
        if self.mode != "netns":
            return
        with contextlib.suppress(FileNotFoundError):
            for ns in os.listdir("/run/netns"):
                if ns.startswith(self.bridge + "-"):
                    self.ip("netns", "del", ns, check=False)
        self.ip("link", "del", self.bridge, check=False)

    def attach(self, uid: str) -> tuple[str | None, str]:
        """(netns name or None, pod IP)."""
        if self.mode != "netns":
            return None, "127.0.0.1"
        with self.lock:
            addr = self.free.pop(0)
        key = uid.replace("-", "")[:10]
        ns, veth = f"{self.bridge}-{key}", f"dk{key}"
        try:
            self.ip("netns", "add", ns)
            self.ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.ip("link", "set", veth, "master", self.bridge, "up")
            self.ip("-n", ns, "addr", "add", f"{addr}/{self.net.prefixlen}", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")
            self.ip("-n", ns, "link", "set", "lo", "up")
            self.ip("-n", ns, "route", "add", "default", "via", self.gateway)
        except RuntimeError:
            self.detach(ns, addr)
            raise
        return ns, addr

    def detach(self, ns: str | None, addr: str) -> None:
        if ns is None:
            return
        self.ip("netns", "del", ns, check=False)  # takes its end of the veth pair along
        with self.lock:
            self.free.append(addr)


class Container:
    """One container of a pod: its process and what the API is told about it."""

    def __init__(self, spec: client.V1Container):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self.started: dt.datetime | None = None
        self.finished: dt.datetime | None = None
        self.exit_code: int | None = None
        self.restarts = 0
        self.reason = ""
        self.message = ""

    def state(self) -> dict:
        if self.proc is not None and self.exit_code is None:
            return {"running": {"startedAt": iso(self.started)}}
        if self.exit_code is not None:
            return {
                "terminated": {
                    "exitCode": self.exit_code,
                    "reason": self.reason or ("Completed" if self.exit_code == 0 else "Error"),
                    "message": self.message or None,
                    "startedAt": iso(self.started) if self.started else None,
                    "finishedAt": iso(self.finished) if self.finished else None,
                }
            }
        return {
            "waiting": {"reason": self.reason or "PodInitializing", "message": self.message or None}
        }

    def status(self, image_id: str = "") -> dict:
        running = self.proc is not None and self.exit_code is None
        return {
            "name": self.spec.name,
            "image": self.spec.image or "",
            "imageID": image_id,
            "ready": running,
            "started": running,
            "restartCount": self.restarts,
            "state": self.state(),
        }


class PodRunner(threading.Thread):
    """Runs one pod: init containers in order, then the containers, restarting
    them as restartPolicy says, and reports status after every change."""

    def __init__(self, agent: Agent, pod: client.V1Pod):
        super().__init__(daemon=True, name=f"pod-{pod.metadata.name}")
        self.agent = agent
        self.pod = pod
        self.ns = pod.metadata.namespace
        self.name = pod.metadata.name
        self.uid = pod.metadata.uid
        self.dir = os.path.join(agent.state, "pods", f"{self.ns}_{self.name}_{self.uid}")
        os.makedirs(self.dir, exist_ok=True)
        self.init = [Container(c) for c in (pod.spec.init_containers or [])]
        self.main = [Container(c) for c in pod.spec.containers]
        self.stopping = threading.Event()
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.phase = "Pending"
        self.start_time = now()
        self.netns: str | None = None
        self.ip = "127.0.0.1"
        self.addressed = False  # has its address (and names in the hosts file)
        self.warned: set[str] = set()
        self.volumes: dict[str, str] = {}
        self.shm_dir = os.path.join("/dev/shm", f"ddpkit-pod-{self.uid}")

    # ---- environment -------------------------------------------------------
    def field(self, path: str) -> str:
        meta = self.pod.metadata
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return ((meta.labels if m.group(1) == "labels" else meta.annotations) or {}).get(
                m.group(2), ""
            )
        return {
            "metadata.name": meta.name,
            "metadata.namespace": meta.namespace,
            "metadata.uid": meta.uid,
            "spec.nodeName": self.pod.spec.node_name or "",
            "spec.serviceAccountName": self.pod.spec.service_account_name or "",
            "status.podIP": self.ip,
            "status.podIPs": self.ip,
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
        }.get(path, "")

    def ref(self, kind: str, name: str, key: str | None, optional: bool):
        """Data of a Secret or ConfigMap (one key, or all of it)."""
        core = self.agent.core
        try:
            if kind == "secret":
                obj = core.read_namespaced_secret(name, self.ns)
                data = {k: base64.b64decode(v).decode() for k, v in (obj.data or {}).items()}
            else:
                obj = core.read_namespaced_config_map(name, self.ns)
                data = dict(obj.data or {})
        except ApiException as e:
            if optional and e.status == 404:
                return {} if key is None else None
            raise RuntimeError(f"{kind} {name}: {e.reason}") from e
        if key is None:
            return data
        if key not in data and not optional:
            raise RuntimeError(f"{kind} {name} has no key {key}")
        return data.get(key)

    def env_for(self, c: client.V1Container) -> dict:
        img = self.image(c)
        uid, gid, _ = self.user(c)
        env = {
            # The image's PATH: its Python environment first (no image: the host's).
            "PATH": img.path() if img else os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": "/root" if not uid else os.path.join(self.dir, "home"),
            "HOSTNAME": self.pod.spec.hostname or self.name,
        }
        if img is not None:
            env["VIRTUAL_ENV"] = img.venv
        if uid:
            os.makedirs(env["HOME"], exist_ok=True)
            os.chown(env["HOME"], uid, gid or 0)
        for src in c.env_from or []:
            prefix = src.prefix or ""
            if src.config_map_ref is not None:
                data = self.ref(
                    "configmap", src.config_map_ref.name, None, bool(src.config_map_ref.optional)
                )
            else:
                data = self.ref("secret", src.secret_ref.name, None, bool(src.secret_ref.optional))
            env.update({prefix + k: v for k, v in data.items()})
        for e in c.env or []:
            if e.value_from is None:
                env[e.name] = expand(e.value or "", env)
                continue
            vf = e.value_from
            if vf.field_ref is not None:
                value = self.field(vf.field_ref.field_path)
            elif vf.secret_key_ref is not None:
                value = self.ref(
                    "secret",
                    vf.secret_key_ref.name,
                    vf.secret_key_ref.key,
                    bool(vf.secret_key_ref.optional),
                )
            elif vf.config_map_key_ref is not None:
                r = vf.config_map_key_ref
                value = self.ref("configmap", r.name, r.key, bool(r.optional))
            elif vf.resource_field_ref is not None:
                value = self.agent.resource_value(c, vf.resource_field_ref.resource)
            else:
                value = None
            if value is not None:
                env[e.name] = value
        return env

    # ---- the sandbox: volumes, network, image ------------------------------------
    def setup(self) -> None:
        """Volumes as local dirs and the pod's network namespace, before any container."""
        self.netns, self.ip = self.agent.network.attach(self.uid)
        self.addressed = True
        sec = self.pod.spec.security_context
        fs_group = sec.fs_group if sec is not None else None
        for v in self.pod.spec.volumes or []:
            own = False  # kubelets make emptyDirs and claims writable for the pod (fsGroup)
            if v.empty_dir is not None:
                if v.empty_dir.medium == "Memory" and os.path.isdir("/dev/shm"):
                    path = os.path.join(self.shm_dir, v.name)  # memory-backed, like a tmpfs
                else:
                    path = os.path.join(self.dir, "volumes", v.name)
                own = True
            elif v.persistent_volume_claim is not None:
                claim = v.persistent_volume_claim.claim_name
                path = os.path.join(self.agent.state, "pvc", self.ns, claim)
                own = True
            elif v.host_path is not None:
                path = v.host_path.path
                if (v.host_path.type or "DirectoryOrCreate") == "DirectoryOrCreate":
                    os.makedirs(path, exist_ok=True)
            else:
                path = os.path.join(self.dir, "volumes", v.name)
                self.fill(v, path)
            if own:
                os.makedirs(path, exist_ok=True)
                uid = self.run_as(None)[0]  # a later fallback to root can still write it
                os.chown(path, uid or 0, fs_group if fs_group is not None else -1)
                os.chmod(path, 0o2775 if fs_group is not None else 0o775)
            self.volumes[v.name] = path

    def fill(self, v: client.V1Volume, path: str) -> None:
        """ConfigMap and Secret volumes as files; anything else (the service account's
        projected token, ...) as an empty directory."""
        os.makedirs(path, exist_ok=True)
        data: dict = {}
        if v.config_map is not None:
            data = self.ref("configmap", v.config_map.name, None, bool(v.config_map.optional))
        elif v.secret is not None:
            data = self.ref("secret", v.secret.secret_name, None, bool(v.secret.optional))
        elif v.projected is not None:
            data = {"namespace": self.ns}
        else:
            log.info(
                "%s: volume %s has a type the agent does not serve: empty dir", self.name, v.name
            )
        for k, val in (data or {}).items():
            with open(os.path.join(path, k), "w") as f:
                f.write(val)

    def teardown(self) -> None:
        self.addressed = False
        self.agent.network.detach(self.netns, self.ip)
        self.netns = None
        shutil.rmtree(self.shm_dir, ignore_errors=True)

    def run_as(self, spec: client.V1Container | None) -> tuple[int | None, int | None, int | None]:
        """(uid, gid, fsGroup) from the pod's securityContext, the container's first."""
        pod = self.pod.spec.security_context
        ctr = spec.security_context if spec is not None else None
        uid = (ctr and ctr.run_as_user) or (pod and pod.run_as_user)
        gid = (ctr and ctr.run_as_group) or (pod and pod.run_as_group)
        return uid, gid, pod.fs_group if pod is not None else None

    def user(self, spec: client.V1Container) -> tuple[int | None, int | None, int | None]:
        """run_as(), or root where that uid cannot start the image's Python (said in the
        agent's log): the pods' user is only as good as the files allow on this host."""
        uid, gid, fs_group = self.run_as(spec)
        img = self.image(spec)
        if uid and img is not None and not self.agent.can_run(img, uid, gid or 0):
            if spec.name in self.warned:
                return None, None, fs_group
            self.warned.add(spec.name)
            log.warning(
                "%s/%s: uid %s cannot run python from %s (a directory on its way is not "
                "searchable for it): running as root instead of the securityContext's user",
                self.name, spec.name, uid, img.venv,
            )  # fmt: skip
            return None, None, fs_group
        return uid, gid, fs_group

    def image(self, spec: client.V1Container) -> Image | None:
        for img in self.agent.images:
            if fnmatch.fnmatchcase(spec.image or "", img.pattern):
                return img
        return None

    def wrap(self, spec: client.V1Container, argv: list[str], env: dict) -> list[str]:
        """The container's command inside its own mount (and UTS, and network) namespace:
        volumes and the image's working directory bind-mounted at their paths, the agent's
        hosts file as /etc/hosts, then the command as the securityContext's user."""
        img = self.image(spec)
        lines = ["set -eu", f"hostname {shlex.quote(self.pod.spec.hostname or self.name)}"]

        def bind(src: str, dst: str, ro: bool = False) -> None:
            # A missing mount point is made in the host's tree (an empty directory),
            # as a runtime makes it in the image's root: the mount itself stays private.
            lines.append(
                f"mkdir -p {shlex.quote(dst)}; mount --bind {shlex.quote(src)} {shlex.quote(dst)}"
            )
            if ro:
                lines.append(f"mount -o remount,bind,ro {shlex.quote(dst)}")

        if img is not None:
            ws = os.path.join(self.dir, "workspace")
            if not os.path.isdir(ws):
                if img.workspace:
                    shutil.copytree(img.workspace, ws, symlinks=True,
                                    ignore=shutil.ignore_patterns(".git", ".venv", "runs", "__pycache__"))  # fmt: skip
                else:
                    os.makedirs(ws)
                uid, gid, _ = self.user(spec)
                if uid:
                    for root, dirs, files in os.walk(ws):
                        for n in [root, *(os.path.join(root, f) for f in dirs + files)]:
                            os.lchown(n, uid, gid or 0)
            bind(ws, img.workdir)
        for m in sorted(spec.volume_mounts or [], key=lambda m: m.mount_path.count("/")):
            src = self.volumes.get(m.name)
            if src is None:
                continue
            if m.sub_path:
                src = os.path.join(src, m.sub_path)
                os.makedirs(src, exist_ok=True)
            bind(src, m.mount_path, bool(m.read_only))
        lines.append(f"mount --bind {shlex.quote(self.agent.hosts)} /etc/hosts")
        # No cluster DNS: names not in the hosts file fail at once, not after the host
        # resolver's time-outs (unreachable from a pod's network namespace).
        lines.append(f"mount --bind {shlex.quote(self.agent.resolv)} /etc/resolv.conf")
        wd = spec.working_dir or (img.workdir if img is not None else self.dir)
        lines.append(f"mkdir -p {shlex.quote(wd)}; cd {shlex.quote(wd)}")
        uid, gid, fs_group = self.user(spec)
        if uid:  # non-root: the kernel drops every capability on the uid change
            groups = ",".join(str(g) for g in dict.fromkeys([gid or 0, fs_group]) if g is not None)
            lines.append(f'exec setpriv --reuid={uid} --regid={gid or 0} --groups={groups} '
                         '--inh-caps=-all --no-new-privs -- "$@"')  # fmt: skip
        else:
            lines.append('exec "$@"')
        script = os.path.join(self.dir, f"{spec.name}.sh")
        with open(script, "w") as f:
            f.write("\n".join(lines) + "\n")
        # Every step execs: the process the agent signals is the container's command.
        prefix = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
        return [*prefix, "unshare", "--mount", "--uts", "--propagation", "private", "--",
                "bash", script, *argv]  # fmt: skip

    # ---- processes -----------------------------------------------------------
    def launch(self, c: Container) -> None:
        spec = c.spec
        c.exit_code = None
        c.reason = c.message = ""
        try:
            env = self.env_for(spec)
        except RuntimeError as e:
            c.reason, c.message = "CreateContainerConfigError", str(e)
            c.exit_code, c.started, c.finished = 1, now(), now()
            return
        argv = [expand(a, env) for a in (spec.command or []) + (spec.args or [])]
        if not spec.command:
            c.reason = "NoCommand"
            c.message = "the node agent runs commands, not images: the container needs a command"
            c.exit_code, c.started, c.finished = 127, now(), now()
            return
        try:
            cmd = self.wrap(spec, argv, env)
        except OSError as e:
            c.reason, c.message = "CreateContainerError", str(e)
            c.exit_code, c.started, c.finished = 128, now(), now()
            return
        try:
            with open(os.path.join(self.dir, f"{spec.name}.log"), "ab") as logf:
                c.proc = subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=self.dir,
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: signals reach its children
                )
        except OSError as e:
            c.reason, c.message = "StartError", str(e)
            c.exit_code, c.started, c.finished = 128, now(), now()
            return
        c.started = now()
        shown = " ".join(a if len(a) < 40 else a[:20] + "..." for a in argv[:12])
        log.info("%s/%s: started %s (pid %d)", self.name, spec.name, shown, c.proc.pid)

    def wait_exit(self, c: Container) -> None:
        if c.proc is None:
            return
        code = c.proc.wait()
        c.exit_code = code if code >= 0 else 128 - code  # killed by signal N -> 128+N
        c.finished = now()
        log.info("%s/%s: exited %d", self.name, c.spec.name, c.exit_code)

    def signal_all(self, sig: int) -> None:
        for c in self.init + self.main:
            if c.proc is not None and c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, sig)

    def terminate(self, grace: int) -> None:
        """SIGTERM, wait the grace period, then SIGKILL (like a kubelet)."""
        self.stopping.set()
        self.signal_all(signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(
            c.proc is not None and c.proc.poll() is None for c in self.init + self.main
        ):
            time.sleep(0.1)
        self.signal_all(signal.SIGKILL)

    # ---- the pod's life --------------------------------------------------------
    def run(self) -> None:
        try:
            try:
                self.setup()
            except (OSError, RuntimeError, ApiException) as e:
                log.error("%s: sandbox: %s", self.name, e)
                for c in self.main:
                    c.reason, c.message = "CreateContainerConfigError", str(e)
                self.finish("Failed")
                return
            self.report()
            policy = self.pod.spec.restart_policy or "Always"
            for c in self.init:
                while not self.stopping.is_set():
                    self.launch(c)
                    self.report()
                    self.wait_exit(c)
                    if c.exit_code == 0 or self.stopping.is_set():
                        break
                    if policy == "Never":
                        self.finish("Failed")
                        return
                    c.restarts += 1
                    self.report()
                    self.stopping.wait(min(10, 2**c.restarts))
            if self.stopping.is_set():
                return
            self.phase = "Running"
            waiters = [
                threading.Thread(target=self.keep, args=(c, policy), daemon=True) for c in self.main
            ]
            for w in waiters:
                w.start()
            for w in waiters:
                w.join()
            if not self.stopping.is_set():
                ok = all(c.exit_code == 0 for c in self.main)
                self.finish("Succeeded" if ok else "Failed")
        except Exception:  # a crash of one pod must not stop the agent
            log.exception("%s: runner failed", self.name)
        finally:
            self.teardown()
            self.done.set()

    def keep(self, c: Container, policy: str) -> None:
        """Run a container until it ends for good under the restart policy."""
        while True:
            with self.lock:
                if self.stopping.is_set():
                    return
                self.launch(c)
            self.report()
            self.wait_exit(c)
            if self.stopping.is_set():
                self.report()
                return
            if policy == "Never" or (policy == "OnFailure" and c.exit_code == 0):
                self.report()
                return
            c.restarts += 1
            c.reason = "CrashLoopBackOff" if c.exit_code else "Completed"
            self.report()
            self.stopping.wait(min(10, 2 ** min(c.restarts, 4)))

    def finish(self, phase: str) -> None:
        self.phase = phase
        self.report()

    def report(self) -> None:
        running = self.phase == "Running" and all(
            c.proc is not None and c.exit_code is None for c in self.main
        )
        initialized = self.phase != "Pending"
        t = iso(now())
        status = {
            "phase": self.phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": iso(self.start_time),
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": t},
                {"type": "Initialized", "status": str(initialized), "lastTransitionTime": t},
                {"type": "ContainersReady", "status": str(running), "lastTransitionTime": t},
                {"type": "Ready", "status": str(running), "lastTransitionTime": t},
            ],
            "initContainerStatuses": [c.status() for c in self.init] or None,
            "containerStatuses": [c.status() for c in self.main],
        }
        try:
            self.agent.core.patch_namespaced_pod_status(self.name, self.ns, {"status": status})
        except ApiException as e:
            if e.status != 404:
                log.warning("%s: status update failed: %s", self.name, e.reason)


def expand(s: str, env: dict) -> str:
    """$(VAR) references as a kubelet expands them; $$(VAR) stays literal."""

    def sub(m: re.Match) -> str:
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$?\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, s)


class Agent:
    def __init__(self, args):
        config.load_kube_config(args.kubeconfig)
        self.core = client.CoreV1Api()
        self.coord = client.CoordinationV1Api()
        self.nodes = [f"{args.prefix}{i}" for i in range(args.nodes)]
        self.cpu, self.memory, self.gpus = args.cpu, args.memory, args.gpus
        self.state = args.state
        self.port = args.port
        self.hosts_file = args.hosts_file
        # Mounted as every pod's /etc/hosts (rewritten in place: a bind mount keeps the inode).
        self.hosts = os.path.join(self.state, "hosts")
        self.images = list(args.image) or [Image("ddpkit:*", os.path.dirname(os.path.dirname(
            os.path.abspath(sys.executable))))]  # fmt: skip
        self.runnable: dict[tuple, bool] = {}
        os.makedirs(os.path.join(self.state, "pods"), exist_ok=True)
        self.resolv = os.path.join(self.state, "resolv.conf")
        with open(self.resolv, "w") as f:
            f.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        self.network = Network(args.network, args.bridge, args.pod_cidr)
        self.runners: dict[str, PodRunner] = {}
        self.next_node = 0
        self.stop = threading.Event()
        os.makedirs(os.path.join(self.state, "pods"), exist_ok=True)

    def can_run(self, img: Image, uid: int, gid: int) -> bool:
        """Whether uid can start the image's Python (cached): a venv whose interpreter
        links into root's home cannot run as the pods' non-root user."""
        key = (img.venv, uid, gid)
        if key not in self.runnable:
            probe = [f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all"]
            r = subprocess.run(
                # Through a shell, as the pod does: setpriv's own exec still has root's
                # capabilities, the shell's exec of python no longer has them.
                ["setpriv", *probe, "bash", "-c", 'exec python -c "import ddpkit"'],
                env={"PATH": img.path(), "HOME": "/"},
                capture_output=True,
                cwd="/",
            )
            self.runnable[key] = r.returncode == 0
        return self.runnable[key]

    def resource_value(self, c, resource: str) -> str:
        if resource.endswith("cpu"):
            return str(self.cpu)
        if resource.endswith("memory"):
            return str(parse_quantity(self.memory))
        return "0"

    # ---- nodes ---------------------------------------------------------------
    def node_status(self) -> dict:
        t = iso(now())
        res = {
            "cpu": str(self.cpu),
            "memory": self.memory,
            "pods": "110",
            "nvidia.com/gpu": str(self.gpus),
            "ephemeral-storage": "100Gi",
        }
        return {
            "capacity": res,
            "allocatable": res,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.36.3",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "ddpkit-node-agent://0",
                "kernelVersion": os.uname().release,
                "osImage": "ddpkit local node",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "ddpkit node agent",
                    "lastHeartbeatTime": t,
                    "lastTransitionTime": t,
                },
                *(
                    {
                        "type": k,
                        "status": "False",
                        "reason": "KubeletHas" + r,
                        "lastHeartbeatTime": t,
                        "lastTransitionTime": t,
                    }
                    for k, r in (
                        ("MemoryPressure", "SufficientMemory"),
                        ("DiskPressure", "NoDiskPressure"),
                        ("PIDPressure", "SufficientPID"),
                    )
                ),
            ],
        }

    def register(self) -> None:
        for name in self.nodes:
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                    },
                },
            }
            try:
                self.core.create_node(body)
            except ApiException as e:
                if e.status != 409:
                    raise
            self.core.patch_node_status(name, {"status": self.node_status()})
            log.info("node %s registered", name)

    def heartbeat(self) -> None:
        """Node Lease renewals and Ready condition, so the node lifecycle
        controller never marks the nodes NotReady (and evicts their pods)."""
        while not self.stop.wait(10):
            for name in self.nodes:
                try:
                    self.renew_lease(name)
                    self.core.patch_node_status(
                        name, {"status": {"conditions": self.node_status()["conditions"]}}
                    )
                except ApiException as e:
                    log.warning("heartbeat %s: %s", name, e.reason)

    def renew_lease(self, name: str) -> None:
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": 40,
            "renewTime": now().strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        try:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": spec})
        except ApiException as e:
            if e.status != 404:
                raise
            self.coord.create_namespaced_lease(
                "kube-node-lease", {"metadata": {"name": name}, "spec": spec}
            )

    # ---- pods ------------------------------------------------------------------
    def bind(self, pod: client.V1Pod) -> None:
        if pod.spec.scheduling_gates:
            return
        node = self.nodes[self.next_node % len(self.nodes)]
        self.next_node += 1
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=pod.metadata.name),
            target=client.V1ObjectReference(kind="Node", name=node, api_version="v1"),
        )
        try:
            # _preload_content=False: the client cannot decode the Binding it gets back.
            self.core.create_namespaced_binding(
                pod.metadata.namespace, body, _preload_content=False
            )
            log.info("bound %s/%s to %s", pod.metadata.namespace, pod.metadata.name, node)
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("bind %s: %s", pod.metadata.name, e.reason)

    def sync(self) -> None:
        pods = self.core.list_pod_for_all_namespaces().items
        seen = set()
        for pod in pods:
            uid = pod.metadata.uid
            if not pod.spec.node_name:
                if pod.metadata.deletion_timestamp is None and pod.status.phase == "Pending":
                    self.bind(pod)
                continue
            if pod.spec.node_name not in self.nodes:
                continue
            seen.add(uid)
            runner = self.runners.get(uid)
            if pod.metadata.deletion_timestamp is not None:
                self.delete(pod, runner)
                continue
            if runner is None and pod.status.phase in (None, "Pending"):
                runner = self.runners[uid] = PodRunner(self, pod)
                runner.start()
            elif runner is None and pod.status.phase == "Running":
                # Its process belonged to an earlier agent and is gone.
                self.core.patch_namespaced_pod_status(
                    pod.metadata.name,
                    pod.metadata.namespace,
                    {
                        "status": {
                            "phase": "Failed",
                            "reason": "NodeAgentRestarted",
                            "message": "the node agent restarted",
                        }
                    },
                )
        for uid in list(self.runners):
            if uid not in seen:
                r = self.runners.pop(uid)
                if not r.done.is_set():
                    threading.Thread(target=r.terminate, args=(0,), daemon=True).start()
        self.write_hosts(pods)

    def delete(self, pod: client.V1Pod, runner: PodRunner | None) -> None:
        """Graceful deletion: stop the processes, then remove the pod for good."""
        if runner is not None and not runner.stopping.is_set():
            grace = pod.metadata.deletion_grace_period_seconds
            if grace is None:
                grace = pod.spec.termination_grace_period_seconds or 30

            def stop_then_remove():
                runner.terminate(grace)
                runner.done.wait(5)
                self.remove(pod)

            threading.Thread(target=stop_then_remove, daemon=True).start()
        elif runner is None or runner.done.is_set():
            self.remove(pod)

    def remove(self, pod: client.V1Pod) -> None:
        try:
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0,
                    preconditions=client.V1Preconditions(uid=pod.metadata.uid),
                ),
            )
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("delete %s: %s", pod.metadata.name, e.reason)

    def write_hosts(self, pods) -> None:
        """Names that pods reach each other by (the operator's headless Services
        `<job>-master-0`, JobSet's `<pod-hostname>.<subdomain>`) -> the pods' addresses:
        in the agent's own hosts file, every pod's /etc/hosts, and, if asked, the host's."""
        entries: dict[str, str] = {}
        for r in list(self.runners.values()):
            if not r.addressed or r.done.is_set() or r.stopping.is_set():
                continue
            p, ns = r.pod, r.ns
            host = p.spec.hostname or p.metadata.name
            names = [p.metadata.name, host]
            if p.spec.subdomain:
                names.append(f"{host}.{p.spec.subdomain}")
            for n in list(names):
                names += [f"{n}.{ns}", f"{n}.{ns}.svc", f"{n}.{ns}.svc.cluster.local"]
            entries.update({n: r.ip for n in names})
        block = [f"{ip} {n}" for n, ip in sorted(entries.items())]
        text = "\n".join(["127.0.0.1 localhost", "::1 localhost ip6-localhost", *block]) + "\n"
        old = None
        with contextlib.suppress(FileNotFoundError), open(self.hosts) as f:
            old = f.read()
        if old != text:
            with open(self.hosts, "w") as f:  # in place: pods bind-mount this inode
                f.write(text)
        if not self.hosts_file:
            return
        block = [HOSTS_BEGIN, *block, HOSTS_END]
        try:
            with open(self.hosts_file) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        if HOSTS_BEGIN in lines and HOSTS_END in lines:
            i, j = lines.index(HOSTS_BEGIN), lines.index(HOSTS_END)
            if lines[i : j + 1] == block:
                return
            lines = lines[:i] + lines[j + 1 :]
        with open(self.hosts_file, "w") as f:
            f.write("\n".join(lines + block) + "\n")

    def clear_hosts(self) -> None:
        if not self.hosts_file or not os.path.exists(self.hosts_file):
            return
        with open(self.hosts_file) as f:
            lines = f.read().splitlines()
        if HOSTS_BEGIN in lines and HOSTS_END in lines:
            i, j = lines.index(HOSTS_BEGIN), lines.index(HOSTS_END)
            with open(self.hosts_file, "w") as f:
                f.write("\n".join(lines[:i] + lines[j + 1 :]) + "\n")

    # ---- logs ---------------------------------------------------------------------
    def log_path(self, ns: str, pod: str, container: str) -> str | None:
        for r in self.runners.values():
            if r.ns == ns and r.name == pod:
                return os.path.join(r.dir, f"{container}.log")
        pods_dir = os.path.join(self.state, "pods")
        for d in sorted(os.listdir(pods_dir)):
            if d.startswith(f"{ns}_{pod}_"):
                return os.path.join(pods_dir, d, f"{container}.log")
        return None

    def serve_logs(self, cert: str, key: str) -> None:
        """GET /containerLogs/NS/POD/CONTAINER, the kubelet endpoint that the
        API server proxies `kubectl logs` to (follow and tailLines honoured)."""
        agent = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                url = urllib.parse.urlparse(self.path)
                parts = url.path.strip("/").split("/")
                q = urllib.parse.parse_qs(url.query)
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404)
                    return
                path = agent.log_path(parts[1], parts[2], parts[3])
                if path is None or not os.path.exists(path):
                    self.send_error(404, "no log")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                with open(path, "rb") as f:
                    data = f.read()
                    if "tailLines" in q:
                        n = int(q["tailLines"][0])
                        data = b"".join(data.splitlines(keepends=True)[-n:]) if n > 0 else b""
                    self.wfile.write(data)
                    if q.get("follow", ["false"])[0] != "true":
                        return
                    runner = next(
                        (
                            r
                            for r in agent.runners.values()
                            if r.name == parts[2] and r.ns == parts[1]
                        ),
                        None,
                    )
                    while runner is not None:
                        chunk = f.read()
                        if chunk:
                            self.wfile.write(chunk)
                            self.wfile.flush()
                        elif runner.done.is_set():
                            return
                        else:
                            time.sleep(0.5)

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        srv = Server(("127.0.0.1", self.port), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()

    # ---- main loop ------------------------------------------------------------------
    def run(self, cert: str | None, key: str | None) -> None:
        self.network.up()
        self.write_hosts([])
        self.register()
        if cert and key:
            self.serve_logs(cert, key)
        threading.Thread(target=self.heartbeat, daemon=True).start()
        while not self.stop.is_set():
            try:
                self.sync()
            except Exception:  # the API server may be restarting: try again
                log.exception("sync failed")
            self.stop.wait(1)
        # Stop every pod at once (SIGTERM, 5 s, SIGKILL): down.sh waits 15 s.
        runners = list(self.runners.values())
        for r in runners:
            r.stopping.set()
            r.signal_all(signal.SIGTERM)
        end = time.monotonic() + 5
        while time.monotonic() < end and not all(r.done.is_set() for r in runners):
            time.sleep(0.1)
        for r in runners:
            r.signal_all(signal.SIGKILL)
            r.done.wait(2)
        self.clear_hosts()
        self.network.down()


def parse_quantity(q: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    for u, f in units.items():
        if q.endswith(u):
            return int(float(q[: -len(u)]) * f)
    return int(q)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument(
        "--state",
        default=os.path.join(os.environ.get("DDPKIT_K8S_STATE", "/tmp/ddpkit-k8s"), "node"),
    )
    ap.add_argument(
        "--nodes", type=int, default=2, help="how many nodes to register (all on this host)"
    )
    ap.add_argument("--prefix", default="ddpkit-node-")
    ap.add_argument("--cpu", default=os.cpu_count() or 2)
    ap.add_argument("--memory", default="16Gi")
    ap.add_argument(
        "--gpus",
        type=int,
        default=8,
        help="nvidia.com/gpu advertised per node (pods run on the CPU)",
    )
    ap.add_argument("--port", type=int, default=10250, help="kubelet port for `kubectl logs`")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument(
        "--image",
        action="append",
        type=Image.parse,
        default=[],
        metavar="PATTERN=VENV[:WORKSPACE]",
        help="what stands in for images matching PATTERN (fnmatch): the Python environment "
        "VENV (its bin/ first on PATH) and the directory copied to /workspace (a derived "
        "image's code); repeatable, first match wins; default ddpkit:*=this agent's venv",
    )
    ap.add_argument(
        "--network",
        choices=("netns", "host"),
        default="netns",
        help="netns: one network namespace per pod on a bridge; host: all pods on 127.0.0.1",
    )
    ap.add_argument("--bridge", default="ddpkit0", help="bridge name (<= 8 chars: netns names)")
    ap.add_argument("--pod-cidr", default="10.244.0.0/24")
    ap.add_argument(
        "--hosts-file", help="keep pod names -> 127.0.0.1 in this hosts file (e.g. /etc/hosts)"
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    agent = Agent(args)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    agent.run(args.tls_cert, args.tls_key)


if __name__ == "__main__":
    main()
