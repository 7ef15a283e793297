"""A small Kubernetes API server on loopback for the real `kubernetes` client: the few paths
the k8s backend uses, with the server-side behaviour that matters to it.

- Custom objects (PyTorchJob, TrainJob): create (with dryRun=All: answered, not stored),
  get. A TrainJob is pruned against the served CRD's
  structural schema like the real API server does; fieldValidation=Strict turns an unknown
  field into 400 "strict decoding error: unknown field ..." (unless `ignores_field_validation`,
  an old server that prunes silently).
- The TrainJob CRD itself (apiextensions.k8s.io/v1), one faithful-in-shape schema per Kubeflow
  Trainer release (`trainjob_crd`, field names read from kubeflow/trainer's trainjob_types.go at
  the tags v2.0.1, v2.1.0, v2.2.1, v2.3.0; core types such as Volume are left unpruned).
- PersistentVolumeClaims: create; namespaces that do not exist or are forbidden.

Only for what the real API server of tests/engines/k8s/test_k8s_real.py cannot be (a cluster without
the operators, an older Trainer's CRD, no RBAC to read CRDs, a server that prunes silently, a
namespace the user may not write, a job that ends at once for --wait); pods, logs, watches, Secrets,
list and delete are the real server's (the fake's were removed with their tests).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from ddpkit.tools import submit as launch

SERVED = {("kubeflow.org", "v1", "pytorchjobs"), ("trainer.kubeflow.org", "v1alpha1", "trainjobs")}
CUSTOM = re.compile(r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?$")
CORE = re.compile(r"^/api/v1/namespaces/([^/]+)/(persistentvolumeclaims)(?:/([^/]+))?$")
CRD = re.compile(r"^/apis/apiextensions.k8s.io/v1/customresourcedefinitions/([^/]+)$")

# --- the TrainJob CRD of each Trainer release ---------------------------------------------------

STR: dict[str, Any] = {"type": "string"}
INT: dict[str, Any] = {"type": "integer"}
MAP: dict[str, Any] = {"type": "object", "additionalProperties": STR}
ANY: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


def arr(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


META = obj(labels=MAP, annotations=MAP)


def _pod_fields(version: str) -> dict[str, Any]:
    container = {"name": STR, "env": arr(ANY), "volumeMounts": arr(ANY)}
    if version >= "2.2":
        container["securityContext"] = ANY
    fields = {
        "serviceAccountName": STR, "nodeSelector": MAP, "tolerations": arr(ANY),
        "volumes": arr(ANY), "initContainers": arr(obj(**container)),
        "containers": arr(obj(**container)), "schedulingGates": arr(ANY),
    }  # fmt: skip
    if version >= "2.1":
        fields |= {"affinity": ANY, "imagePullSecrets": arr(ANY)}
    if version >= "2.2":
        fields["securityContext"] = ANY
    if version >= "2.3":
        fields["terminationGracePeriodSeconds"] = INT
    return fields


def trainjob_crd(version: str) -> dict[str, Any]:
    """The CustomResourceDefinition trainjobs.trainer.kubeflow.org of Trainer `version`."""
    spec = {
        "runtimeRef": obj(name=STR, apiGroup=STR, kind=STR),
        "initializer": ANY,
        "trainer": obj(
            image=STR, command=arr(STR), args=arr(STR), env=arr(ANY), numNodes=INT,
            resourcesPerNode=ANY,
            numProcPerNode=INT if version >= "2.2" else {"x-kubernetes-int-or-string": True},
        ),
        "suspend": {"type": "boolean"},
        "managedBy": STR,
    }  # fmt: skip
    target = arr(obj(name=STR))
    if version == "2.0":
        spec |= {"labels": MAP, "annotations": MAP}
        spec["podSpecOverrides"] = arr(obj(targetJobs=target, **_pod_fields(version)))
    elif version == "2.1":
        spec |= {"labels": MAP, "annotations": MAP}
        spec["podTemplateOverrides"] = arr(
            obj(targetJobs=target, metadata=META, spec=obj(**_pod_fields(version)))
        )
    else:
        pod = obj(template=obj(metadata=META, spec=obj(**_pod_fields(version))))
        job = obj(name=STR, template=obj(metadata=META, spec=pod))
        template = obj(metadata=META, spec=obj(replicatedJobs=arr(job)))
        spec["runtimePatches"] = arr(
            obj(manager=STR, time=STR, trainingRuntimeSpec=obj(template=template))
        )
        spec["activeDeadlineSeconds"] = INT
    root = obj(apiVersion=STR, kind=STR, metadata={"type": "object"}, spec=obj(**spec))
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "trainjobs.trainer.kubeflow.org"},
        "spec": {
            "group": "trainer.kubeflow.org",
            "names": {"kind": "TrainJob", "plural": "trainjobs"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                }
            ],  # fmt: skip
        },
    }


def prune(value: Any, schema: dict[str, Any], path: str = "") -> tuple[Any, list[str]]:
    """Structural pruning: (the value without unknown fields, the dropped paths)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value, []
    if isinstance(value, dict) and "properties" in schema:
        out, dropped = {}, []
        for key, sub in value.items():
            where = f"{path}.{key}" if path else key
            if key not in schema["properties"]:
                dropped.append(where)
                continue
            out[key], more = prune(sub, schema["properties"][key], where)
            dropped += more
        return out, dropped
    if isinstance(value, dict) and "additionalProperties" in schema:
        return value, []
    if isinstance(value, list) and "items" in schema:
        pairs = [prune(v, schema["items"], f"{path}[{i}]") for i, v in enumerate(value)]
        return [p[0] for p in pairs], [d for p in pairs for d in p[1]]
    return value, []


def prune_object(body: dict[str, Any], crd: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec, dropped = prune(body.get("spec", {}), root["properties"]["spec"], "spec")
    return body | {"spec": spec}, dropped


# --- the server ---------------------------------------------------------------------------------


class FakeCluster:
    """The API server's state: namespaces, served resources, objects."""

    def __init__(self) -> None:
        self.namespaces = {"default", "ml", "locked"}
        self.forbidden = {"locked"}
        self.served = set(SERVED)
        self.trainer_version: str | None = "2.3"  # the TrainJob CRD served; None: no CRD
        self.crd_forbidden = False  # the user may not read CRDs (cluster-scoped)
        self.ignores_field_validation = False  # an old API server: prunes silently
        self.objects: dict[tuple, dict] = {}  # (plural, ns, name) -> object
        self.requests: list[tuple[str, str, dict]] = []
        self.finish_as: str | None = None  # a created job reports this condition at once


def _status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "details": details or {}, "code": code}  # fmt: skip


class Handler(BaseHTTPRequestHandler):
    cluster: FakeCluster

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, code: int, body: dict | str, ctype: str = "application/json") -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        c, url = self.cluster, urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}") if length else {}
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        c.requests.append((method, url.path, body | {"?": query} if query else body))
        if m := CRD.match(url.path):
            if c.crd_forbidden:
                return self._send(403, _status(403, "Forbidden", "customresourcedefinitions is "
                                               'forbidden: User "dev" cannot get'))  # fmt: skip
            if m.group(1) != "trainjobs.trainer.kubeflow.org" or c.trainer_version is None:
                return self._send(404, _status(404, "NotFound", f'"{m.group(1)}" not found',
                                               {"name": m.group(1)}))  # fmt: skip
            return self._send(200, trainjob_crd(c.trainer_version))
        if m := CUSTOM.match(url.path):
            group, version, ns, plural, name = m.groups()
            if (group, version, plural) not in c.served:
                return self._send(404, "404 page not found\n", "text/plain")
            return self._object(method, plural, ns, name, body, query)
        if m := CORE.match(url.path):
            ns, plural, name = m.groups()
            if ns in c.forbidden:
                return self._forbidden(plural, ns)
            return self._object(method, plural, ns, name, body, query)
        self._send(404, "404 page not found\n", "text/plain")

    def _forbidden(self, plural: str, ns: str) -> None:
        self._send(403, _status(403, "Forbidden", f'{plural} is forbidden: User "dev" cannot '
                                f'access {plural} in the namespace "{ns}"'))  # fmt: skip

    def _create(self, plural: str, ns: str, body: dict, query: dict) -> None:
        c = self.cluster
        if plural == "trainjobs" and c.trainer_version is not None:
            body, dropped = prune_object(body, trainjob_crd(c.trainer_version))
            strict = query.get("fieldValidation") == "Strict" and not c.ignores_field_validation
            if dropped and strict:
                unknown = ", ".join(f'unknown field "{d}"' for d in dropped)
                return self._send(400, _status(400, "BadRequest", 'TrainJob in version '
                                               '"v1alpha1" cannot be handled as a TrainJob: '
                                               f"strict decoding error: {unknown}"))  # fmt: skip
        key = (plural, ns, body["metadata"]["name"])
        if key in c.objects:
            return self._send(409, _status(409, "AlreadyExists",
                                           f'{plural} "{key[2]}" already exists',
                                           {"name": key[2], "kind": plural}))  # fmt: skip
        if query.get("dryRun") == "All":  # admitted, validated, pruned: not stored
            return self._send(201, body)
        if c.finish_as:
            body = body | {"status": {"conditions": [{"type": c.finish_as, "status": "True"}]}}
        c.objects[key] = body
        return self._send(201, body)

    def _object(self, method: str, plural: str, ns: str, name: str | None, body: dict,
                query: dict) -> None:  # fmt: skip
        c = self.cluster
        if ns in c.forbidden:
            return self._forbidden(plural, ns)
        if ns not in c.namespaces:
            return self._send(404, _status(404, "NotFound", f'namespaces "{ns}" not found',
                                           {"name": ns, "kind": "namespaces"}))  # fmt: skip
        if method == "POST":
            return self._create(plural, ns, body, query)
        key = (plural, ns, name)
        if key not in c.objects:
            return self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found',
                                           {"name": name, "kind": plural}))  # fmt: skip
        return self._send(200, c.objects[key])

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    state = FakeCluster()
    handler = type("H", (Handler,), {"cluster": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    server_url = f"http://127.0.0.1:{server.server_address[1]}"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server_url}}],
        "users": [{"name": "dev", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "dev"}}],
    }))  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.chdir(tmp_path)  # the workspace: .ddpkit/jobs/ (last_job.json)
    yield state
    server.shutdown()
    server.server_close()


def cli(capsys: Any, *argv: str) -> tuple[int, str, str]:
    rc = launch.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err
