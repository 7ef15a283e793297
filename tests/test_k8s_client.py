"""submit/status/logs/cancel k8s through the real `kubernetes` client, against a small HTTP
server on loopback that speaks the few API paths the backend uses."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from tools import launch
from tools.backends import k8s
from tools.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SERVED = {("kubeflow.org", "v1", "pytorchjobs"), ("trainer.kubeflow.org", "v1alpha1", "trainjobs")}
CUSTOM = re.compile(r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?$")
CORE = re.compile(r"^/api/v1/namespaces/([^/]+)/(pods|persistentvolumeclaims)(?:/([^/]+))?(/log)?$")


class FakeCluster:
    """The API server's state: namespaces, served resources, objects, pods and their logs."""

    def __init__(self) -> None:
        self.namespaces = {"default", "ml", "locked"}
        self.forbidden = {"locked"}
        self.served = set(SERVED)
        self.objects: dict[tuple, dict] = {}  # (plural, ns, name) -> object
        self.pods: dict[tuple, dict] = {}  # (ns, name) -> {"labels":..., "log":..., "phase":...}
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
        if m := CUSTOM.match(url.path):
            group, version, ns, plural, name = m.groups()
            if (group, version, plural) not in c.served:
                return self._send(404, "404 page not found\n", "text/plain")
            return self._object(method, plural, ns, name, body)
        if m := CORE.match(url.path):
            ns, plural, name, log = m.groups()
            if ns in c.forbidden:
                return self._forbidden(plural, ns)
            if plural == "persistentvolumeclaims":
                return self._object(method, plural, ns, name, body)
            if log:
                pod = c.pods.get((ns, name))
                if pod is None:
                    return self._send(404, _status(404, "NotFound", f'pods "{name}" not found',
                                                   {"name": name, "kind": "pods"}))  # fmt: skip
                return self._send(200, pod["log"], "text/plain")
            want = dict(kv.split("=", 1) for kv in query.get("labelSelector", "").split(",") if kv)
            items = [
                {"metadata": {"name": n, "namespace": ns, "labels": p["labels"]},
                 "status": {"phase": p["phase"], "containerStatuses": [
                     {"name": "pytorch", "restartCount": p.get("restarts", 0), "ready": True,
                      "image": "x", "imageID": "", "state": {}}]}}
                for (pns, n), p in c.pods.items()
                if pns == ns and want.items() <= p["labels"].items()
            ]  # fmt: skip
            return self._send(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
        self._send(404, "404 page not found\n", "text/plain")

    def _forbidden(self, plural: str, ns: str) -> None:
        self._send(403, _status(403, "Forbidden", f'{plural} is forbidden: User "dev" cannot '
                                f'access {plural} in the namespace "{ns}"'))  # fmt: skip

    def _object(self, method: str, plural: str, ns: str, name: str | None, body: dict) -> None:
        c = self.cluster
        if ns in c.forbidden:
            return self._forbidden(plural, ns)
        if ns not in c.namespaces:
            return self._send(404, _status(404, "NotFound", f'namespaces "{ns}" not found',
                                           {"name": ns, "kind": "namespaces"}))  # fmt: skip
        if method == "POST":
            key = (plural, ns, body["metadata"]["name"])
            if key in c.objects:
                return self._send(409, _status(409, "AlreadyExists",
                                               f'{plural} "{key[2]}" already exists',
                                               {"name": key[2], "kind": plural}))  # fmt: skip
            c.objects[key] = body
            if c.finish_as:
                body = body | {"status": {"conditions": [{"type": c.finish_as, "status": "True"}]}}
                c.objects[key] = body
            return self._send(201, body)
        key = (plural, ns, name)
        if key not in c.objects:
            return self._send(404, _status(404, "NotFound", f'{plural} "{name}" not found',
                                           {"name": name, "kind": plural}))  # fmt: skip
        if method == "DELETE":
            del c.objects[key]
            return self._send(200, {"kind": "Status", "status": "Success"})
        return self._send(200, c.objects[key])

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


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
    monkeypatch.setattr("tools.backends.OUT_DIR", tmp_path / "out")  # last_job.json
    yield state
    server.shutdown()
    server.server_close()


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = launch.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_submit_creates_the_rendered_objects_and_remembers_the_job(cluster, capsys):
    sets = ["--set", "name=ctest", "--set", "k8s.pvc_size=5Gi", "--nodes", "2"]
    rc, out, err = cli(capsys, "submit", "k8s", *sets)
    assert rc == 0, err
    spec = load_spec(ROOT / "configs/default.toml", ["name=ctest", "k8s.pvc_size=5Gi"], 2)
    rendered = list(yaml.safe_load_all(k8s.render(spec)))
    assert cluster.objects[("persistentvolumeclaims", "default", "ctest-ckpt")] == rendered[0]
    assert cluster.objects[("pytorchjobs", "default", "ctest")] == rendered[1]
    assert "created pytorchjob/ctest" in out
    # Again: the PVC is reused, the job exists -> 409 -> one line saying what to do.
    rc, out, err = cli(capsys, "submit", "k8s", *sets)
    assert rc == 2 and "Traceback" not in err
    assert "persistentvolumeclaim/ctest-ckpt exists; reusing it" in err
    last = err.splitlines()[-1]
    assert last.startswith("error: PyTorchJob ctest: already exists")
    assert "cancel k8s ctest -n default" in last and "--set name=" in last

    # status/logs/cancel without a job name use the last one submitted.
    cluster.objects[("pytorchjobs", "default", "ctest")]["status"] = {
        "conditions": [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated"},
                       {"type": "Running", "status": "True", "message": "job is running"}],
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1, "failed": 0}},
    }  # fmt: skip
    labels = {"training.kubeflow.org/job-name": "ctest"}
    cluster.pods[("default", "ctest-master-0")] = {
        "labels": labels | {"training.kubeflow.org/replica-type": "master"},
        "phase": "Running", "log": "step 1/3 loss 2.3\nstep 2/3 loss 2.1\n", "restarts": 0,
    }  # fmt: skip
    cluster.pods[("default", "other-master-0")] = {
        "labels": {"training.kubeflow.org/job-name": "other"},
        "phase": "Running",
        "log": "no",
    }
    cluster.pods[("default", "ctest-worker-0")] = {
        "labels": labels,
        "phase": "Running",
        "log": "worker\n",
        "restarts": 2,
    }
    rc, out, err = cli(capsys, "status", "k8s")
    assert rc == 0, err
    assert "condition Running=True  job is running" in out
    assert "Worker: active 1, succeeded 0, failed 0" in out
    assert "pod ctest-worker-0: Running (restarts 2)" in out and "other-master-0" not in out

    rc, out, err = cli(capsys, "logs", "k8s")
    assert rc == 0 and out == "step 1/3 loss 2.3\nstep 2/3 loss 2.1\n", err
    method, path, body = cluster.requests[-1]
    assert path == "/api/v1/namespaces/default/pods/ctest-master-0/log"
    assert body["?"] == {"container": "pytorch", "follow": "true"}

    rc, out, err = cli(capsys, "cancel", "k8s")
    assert rc == 0 and "deleted pytorchjob/ctest" in out
    assert cluster.requests[-1][0] == "DELETE"
    assert cluster.requests[-1][2]["?"] == {"propagationPolicy": "Foreground"}
    assert ("pytorchjobs", "default", "ctest") not in cluster.objects
    assert ("persistentvolumeclaims", "default", "ctest-ckpt") in cluster.objects  # kept
    rc, out, err = cli(capsys, "status", "k8s", "ctest")
    assert rc == 2 and "not found" in err and "Traceback" not in err


def test_elastic_logs_come_from_worker_0_and_trainjob_goes_to_trainer_api(cluster, capsys):
    rc, _, err = cli(capsys, "submit", "k8s", "--set", "name=el", "--set", "k8s.elastic.min=1",
                     "--set", "k8s.elastic.max=2")  # fmt: skip
    assert rc == 0, err
    cluster.pods[("default", "el-worker-0")] = {"labels": {}, "phase": "Running", "log": "w0\n"}
    rc, out, err = cli(capsys, "logs", "k8s", "el")
    assert rc == 0 and out == "w0\n", err

    rc, _, err = cli(capsys, "submit", "k8s", "--set", "name=tj", "--set", "k8s.api=trainjob",
                     "--set", "k8s.namespace=ml")  # fmt: skip
    assert rc == 0, err
    assert cluster.objects[("trainjobs", "ml", "tj")]["kind"] == "TrainJob"
    cluster.pods[("ml", "tj-node-0-0-abcde")] = {
        "labels": {"jobset.sigs.k8s.io/jobset-name": "tj",
                   "batch.kubernetes.io/job-completion-index": "0"},
        "phase": "Running", "log": "node0\n"}  # fmt: skip
    rc, out, err = cli(capsys, "logs", "k8s")  # the last job: tj in ml
    assert rc == 0 and out == "node0\n", err
    assert cluster.requests[-1][2]["?"]["container"] == "node"


@pytest.mark.parametrize(
    ("sets", "setup", "expect"),
    [
        (["k8s.namespace=locked"], None, "forbidden"),
        (["k8s.namespace=nope"], None, "namespace 'nope' does not exist"),
        ([], lambda c: c.served.clear(), "install the Kubeflow training operator"),
        (["k8s.api=trainjob"], lambda c: c.served.discard(
            ("trainer.kubeflow.org", "v1alpha1", "trainjobs")), "install Kubeflow Trainer v2"),
    ],
)  # fmt: skip
def test_api_errors_are_one_clear_line(cluster, capsys, sets, setup, expect):
    if setup:
        setup(cluster)
    rc, out, err = cli(capsys, "submit", "k8s", *[a for s in sets for a in ("--set", s)])
    assert rc == 2 and expect in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not any(k[0] == "pytorchjobs" for k in cluster.objects)


def test_no_kubeconfig_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    rc, out, err = cli(capsys, "status", "k8s", "some-job")
    assert rc == 2 and "no Kubernetes credentials" in err and "KUBECONFIG" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(("outcome", "rc"), [("Succeeded", 0), ("Failed", 1)])
def test_submit_wait_follows_the_job_to_its_end(cluster, capsys, outcome, rc):
    cluster.finish_as = outcome
    got, out, err = cli(capsys, "submit", "k8s", "--set", "name=w", "--wait")
    assert got == rc and f"w: {outcome}" in err
