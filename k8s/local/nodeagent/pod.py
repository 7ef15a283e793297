"""One pod's life: its init containers, then its containers as processes under the
restart policy, SIGTERM / grace period / SIGKILL on delete."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

from kubernetes import client
from kubernetes.client.rest import ApiException

from .common import AgentView, expand, log, lost, now
from .sandbox import Sandbox
from .status import Container, PodStatus


class PodRunner(Sandbox, PodStatus, threading.Thread):
    """Runs one pod: init containers in order, then the containers, restarting
    them as restartPolicy says, and reports status after every change."""

    def __init__(self, agent: AgentView, pod: client.V1Pod):
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
        self.died_with_node = False  # its processes went with its node (lose-node)

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
            if lost(self.agent.state, self.pod.spec.node_name):
                self.died_with_node = True  # no restart, no word: the node is down
                self.stopping.set()
                return
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
