"""The pod runtime: an image as a local Python environment, and a pod's sandbox (its
environment, volumes as local dirs, the mount/UTS/network namespaces its containers run
in, the securityContext's user)."""

from __future__ import annotations

import argparse
import base64
import fnmatch
import os
import re
import shlex
import shutil
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.rest import ApiException

from . import incluster
from .common import AgentView, expand, log


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


class Sandbox:
    """PodRunner's sandbox: env, volumes, namespaces and user of its containers (a mixin:
    the runner's attributes are set in PodRunner.__init__)."""

    agent: AgentView
    pod: client.V1Pod

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
        env.update(self.agent.api_env())  # in-cluster config (a kubelet's service env)
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
        """ConfigMap, Secret and projected volumes (the service account's token) as files;
        anything else as an empty directory."""
        os.makedirs(path, exist_ok=True)
        data: dict = {}
        if v.config_map is not None:
            data = self.ref("configmap", v.config_map.name, None, bool(v.config_map.optional))
        elif v.secret is not None:
            data = self.ref("secret", v.secret.secret_name, None, bool(v.secret.optional))
        elif v.projected is not None:  # the service account's: token, CA, namespace
            try:
                data = incluster.token_files(self.agent.core, self.pod, v.projected, self.ref,
                                             self.field)  # fmt: skip
            except (ApiException, RuntimeError) as e:  # the pod runs on, without API access
                log.warning("%s: volume %s: %s: namespace only", self.name, v.name, e)
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
