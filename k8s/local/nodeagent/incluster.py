"""The API server as pods reach it: what a kubelet and kube-proxy give a pod so that the
`kubernetes` client's in-cluster config works in it (a kit job's pods patch their own job to
keep a failing node out, ddpkit.k8s.exclude).

- KUBERNETES_SERVICE_HOST / _PORT in every container's environment. The host is the name
  `kubernetes.default.svc` (in the serving certificate's names, k8s/local/up.sh), which the
  hosts file points at the pod network's gateway, or 127.0.0.1 with host networking.
- In netns mode a TCP relay on the gateway's address and the API server's port to the API
  server on 127.0.0.1 (it listens on loopback only; kube-proxy's job for the Service IP).
- The service account's projected volume (sandbox.py fills it from `token_files`): a bound
  token from the TokenRequest API, the cluster's CA (the kube-root-ca.crt ConfigMap) and
  the namespace. Not refreshed: kube-apiserver extends a 3607-second pod-bound token to a
  year (--service-account-extend-token-expiration, on by default), as for a kubelet's.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any
from urllib.parse import urlparse

from kubernetes import client

from .common import log

API_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local")  # fmt: skip
TOKEN_SECONDS = 3607  # a kubelet's default request: the API server extends it


class ApiAccess:
    """The Agent's in-cluster API access for pods (a mixin)."""

    core: Any
    network: Any
    host_names: tuple[str, ...] = ()  # --host-name: names that stand for this host

    def api_port(self) -> int:
        url = urlparse(self.core.api_client.configuration.host)
        return url.port or 443

    def api_address(self) -> str:
        """Where a pod reaches the API server: the gateway (netns) or loopback (host)."""
        return self.network.gateway if self.network.mode == "netns" else "127.0.0.1"

    def api_env(self) -> dict[str, str]:
        port = str(self.api_port())
        return {
            "KUBERNETES_SERVICE_HOST": "kubernetes.default.svc",
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
        }

    def api_hosts(self) -> dict[str, str]:
        """The API server's names, and --host-name's (a controller's Service served on this
        host, e.g. Trainer's status server, which listens on every address: no relay)."""
        return dict.fromkeys((*API_NAMES, *self.host_names), self.api_address())

    def serve_api(self) -> None:
        """netns mode: relay the gateway's API port to the API server on loopback."""
        if self.network.mode != "netns":
            return
        port = self.api_port()
        srv = socket.create_server((self.network.gateway, port), reuse_port=False)
        log.info("API server relay on %s:%d", self.network.gateway, port)

        def accept() -> None:
            while True:
                conn, _ = srv.accept()
                threading.Thread(target=_relay, args=(conn, port), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()


def _relay(conn: socket.socket, port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        conn.close()
        return
    upstream.settimeout(None)

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    back = threading.Thread(target=pump, args=(upstream, conn), daemon=True)
    back.start()
    pump(conn, upstream)
    back.join()
    conn.close()
    upstream.close()


def token_files(core: Any, pod: Any, projected: Any, ref: Any, field: Any) -> dict[str, str]:
    """A projected volume's files: serviceAccountToken (a token bound to the pod), configMap
    and secret items (`ref(kind, name, key, optional)` reads them), downwardAPI fields
    (`field(path)`)."""
    files: dict[str, str] = {}
    for src in projected.sources or []:
        if src.service_account_token is not None:
            t = src.service_account_token
            body = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(
                    audiences=[t.audience] if t.audience else [],
                    expiration_seconds=t.expiration_seconds or TOKEN_SECONDS,
                    bound_object_ref=client.V1BoundObjectReference(
                        kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid
                    ),
                )
            )
            got = core.create_namespaced_service_account_token(
                pod.spec.service_account_name or "default", pod.metadata.namespace, body
            )
            files[t.path] = got.status.token
        for kind, part in (("configmap", src.config_map), ("secret", src.secret)):
            if part is None:
                continue
            data = ref(kind, part.name, None, bool(part.optional)) or {}
            items = part.items or [client.V1KeyToPath(key=k, path=k) for k in data]
            files.update({i.path: data[i.key] for i in items if i.key in data})
        if src.downward_api is not None:
            for item in src.downward_api.items or []:
                if item.field_ref is not None:
                    files[item.path] = field(item.field_ref.field_path)
    return files
