"""The TrainJob status poster (train/trainjob_status.py) against a local HTTPS server of the
test's own: a CA and a server certificate made here (the `cryptography` package), the request
Trainer's status server takes, and a server that refuses, errs or never answers. Training's
side of it (update()) must never wait on any of them."""

from __future__ import annotations

import datetime
import http.server
import json
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest
from ddpkit.train import goodput, trainjob_status
from ddpkit.train.trainjob_status import Poster, status_body

cryptography = pytest.importorskip("cryptography")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/tj/status"
TOKEN = "tok-secret-123"


def _cert(name: str, key, issuer_key=None, issuer=None, ca: bool = False, san=None):
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer or subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if ca:
        b = b.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
    return b.sign(issuer_key or key, hashes.SHA256())


def _pem(obj) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA, a server certificate it signs for 127.0.0.1, and a CA that signed nothing."""
    d = tmp_path_factory.mktemp("pki")
    ca_key, other_key, key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _cert("test-ca", ca_key, ca=True)
    import ipaddress

    san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    crt = _cert("status", key, issuer_key=ca_key, issuer=ca.subject, san=san)
    files = {"ca": _pem(ca), "other": _pem(_cert("other-ca", other_key, ca=True)),
             "crt": _pem(crt) + _pem(ca), "key": _pem(key)}  # fmt: skip
    out = {}
    for name, data in files.items():
        (d / name).write_bytes(data)
        out[name] = d / name
    return out


class Server:
    """Trainer's status server as the poster sees it: records each POST, answers `code`
    (200 echoes the body; else a metav1.Status), or holds the connection (`silent`)."""

    def __init__(self, pki: dict[str, Path]):
        self.requests: list[dict] = []
        self.code = 200
        self.silent = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append({"path": self.path, "time": time.monotonic(),
                                       "auth": self.headers.get("Authorization"),
                                       "type": self.headers.get("Content-Type"),
                                       "body": json.loads(body)})  # fmt: skip
                status = {"kind": "Status", "message": "Forbidden", "code": outer.code}
                reply = body if outer.code == 200 else json.dumps(status).encode()
                self.send_response(outer.code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(pki["crt"], pki["key"])
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}{PATH}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(pki):
    s = Server(pki)
    yield s
    s.close()


@pytest.fixture
def token(tmp_path) -> Path:
    p = tmp_path / "token"
    p.write_text(TOKEN + "\n")
    return p


def wait_for(pred, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "not in time"
        time.sleep(0.01)


def test_a_post_is_the_request_trainers_server_takes(server, pki, token):
    warned: list[str] = []
    p = Poster(server.url, str(pki["ca"]), str(token), total=200, warn=warned.append)
    p.update(50, eta_s=12.4, metrics={"loss": 0.123456789, "samples_per_s": 2048.0, "x": None})
    wait_for(lambda: server.requests)
    p.close()
    req = server.requests[0]
    assert req["path"] == PATH and req["type"] == "application/json"
    assert req["auth"] == f"Bearer {TOKEN}"  # the file's content, stripped
    st = req["body"]["trainerStatus"]
    assert st["progressPercentage"] == 25 and st["estimatedRemainingSeconds"] == 12
    assert st["metrics"] == [{"name": "loss", "value": "0.123457"},
                             {"name": "samples_per_s", "value": "2048"}]  # fmt: skip
    stamp = datetime.datetime.strptime(st["lastUpdatedTime"], "%Y-%m-%dT%H:%M:%SZ")
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    assert abs((now - stamp).total_seconds()) < 60
    assert warned == [] and p.posted == len(server.requests) and p.failed == 0


def test_posts_keep_their_interval_and_the_last_one_is_the_final_state(server, pki, token):
    """Updates every 10 ms for ~0.5 s, interval 0.15 s: the first goes at once, then one per
    interval with the newest values, and close() posts the final state."""
    p = Poster(server.url, str(pki["ca"]), str(token), interval_s=0.15, total=50)
    for step in range(1, 51):
        p.update(step, metrics={"state": "training", "loss": 1.0 / step})
        time.sleep(0.01)
    p.close()
    times = [r["time"] for r in server.requests]
    assert 3 <= len(times) <= 6, times  # ~0.5 s / 0.15 s, plus the final one
    gaps = [b - a for a, b in zip(times[:-2], times[1:-1], strict=True)]
    assert all(g >= 0.14 for g in gaps), gaps  # the final post alone may come sooner
    progress = [r["body"]["trainerStatus"]["progressPercentage"] for r in server.requests]
    assert progress == sorted(progress) and progress[0] < 10 and progress[-2] <= 99
    final = server.requests[-1]["body"]["trainerStatus"]
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0
    metrics = {m["name"]: m["value"] for m in final["metrics"]}
    assert metrics == {"state": "finished", "loss": "0.02"}


def test_the_token_file_is_read_at_every_post(server, pki, token):
    """The kubelet rotates the projected token: a post sends the file as it is then."""
    p = Poster(server.url, str(pki["ca"]), str(token), interval_s=0.05, total=10)
    p.update(1)
    wait_for(lambda: len(server.requests) == 1)
    token.write_text("rotated")
    time.sleep(0.06)
    p.update(2)
    wait_for(lambda: len(server.requests) == 2)
    p.close()
    assert [r["auth"] for r in server.requests[:2]] == [f"Bearer {TOKEN}", "Bearer rotated"]


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"https://127.0.0.1:{port}{PATH}"  # nothing listens there now


def _updates_take(p: Poster, n: int) -> float:
    """The longest of n update() calls, in seconds."""
    worst = 0.0
    for step in range(1, n + 1):
        t = time.perf_counter()
        p.update(step, metrics={"loss": 1.0})
        worst = max(worst, time.perf_counter() - t)
        time.sleep(0.002)
    return worst


def test_a_refused_endpoint_warns_once_and_never_holds_training(pki, token):
    warned: list[str] = []
    p = Poster(_closed_port_url(), str(pki["ca"]), str(token), interval_s=0.02, total=500,
               warn=warned.append)  # fmt: skip
    worst = _updates_take(p, 200)
    t = time.perf_counter()
    p.close()
    assert time.perf_counter() - t < 0.5  # the last post failed: close does not wait for one
    assert worst < 0.05, worst
    assert p.failed >= 3 and p.posted == 0  # it kept trying, quietly
    assert (
        len(warned) == 1
        and "warning: TrainJob status not posted to https://127.0.0.1:" in (warned[0])
    )
    assert "ConnectionRefusedError" in warned[0] and TOKEN not in warned[0]


def test_a_server_that_never_answers_holds_no_update_and_no_end(pki, token):
    """A server that takes the connection and says nothing (a hung controller): the thread
    waits out its timeout; every update() and the end of the run go on at once."""
    lst = socket.create_server(("127.0.0.1", 0))
    lst.listen(8)
    url = f"https://127.0.0.1:{lst.getsockname()[1]}{PATH}"
    warned: list[str] = []
    p = Poster(url, str(pki["ca"]), str(token), timeout_s=0.5, total=100, warn=warned.append)
    try:
        worst = _updates_take(p, 100)  # ~0.2 s: the first post hangs the whole time
        wait_for(lambda: warned, timeout=3)
        t = time.perf_counter()
        p.close()
        assert time.perf_counter() - t < 0.3
    finally:
        lst.close()
    assert worst < 0.05, worst
    assert warned == [warned[0]] and "no answer within the timeout" in warned[0], warned


def test_a_refusal_by_the_server_is_one_line_with_its_status(server, pki, token):
    server.code = 403
    warned: list[str] = []
    p = Poster(server.url, str(pki["ca"]), str(token), interval_s=0.02, warn=warned.append)
    for step in range(5):
        p.update(step)
        time.sleep(0.03)
    p.close()
    assert len(server.requests) >= 2 and len(warned) == 1
    assert "HTTP 403 (Forbidden)" in warned[0] and TOKEN not in warned[0]


def test_a_server_certificate_from_another_ca_is_not_trusted(server, pki, token):
    warned: list[str] = []
    p = Poster(server.url, str(pki["other"]), str(token), warn=warned.append)
    p.update(1)
    wait_for(lambda: warned)
    p.close()
    assert server.requests == [] and "CERTIFICATE_VERIFY_FAILED" in warned[0]


@pytest.mark.parametrize(
    ("step", "total", "pct"), [(0, 10, 0), (1, 3, 33), (999, 1000, 99), (10, 10, 100),
                               (12, 10, 100), (-1, 10, 0), (5, None, None), (5, 0, None)],
)  # fmt: skip
def test_progress_is_whole_percent_and_100_only_at_the_end(step, total, pct):
    st = status_body(step, total, None, {}, 0.0)["trainerStatus"]
    assert st.get("progressPercentage") == pct
    assert "estimatedRemainingSeconds" not in st and st["lastUpdatedTime"] == "1970-01-01T00:00:00Z"


def test_metrics_fit_the_crd():
    """256 metrics at most, names and values of 1-64 characters, values as strings."""
    metrics = {f"m{i}": i for i in range(300)}
    metrics.update({"n" * 80: "v" * 80, "nan": float("nan"), "flag": True, "": 1, "empty": ""})
    st = status_body(1, 2, -5.0, metrics, 0.0)["trainerStatus"]
    assert len(st["metrics"]) == 256 and st["estimatedRemainingSeconds"] == 0
    st = status_body(1, 2, float("inf"), dict(list(metrics.items())[-5:]), 0.0)["trainerStatus"]
    assert "estimatedRemainingSeconds" not in st
    assert st["metrics"] == [{"name": "n" * 64, "value": "v" * 64}, {"name": "nan", "value": "nan"},
                             {"name": "flag", "value": "true"}]  # fmt: skip


def test_from_env_needs_the_url_and_can_be_switched_off(token):
    assert trainjob_status.from_env(env={}) is None
    env = {trainjob_status.URL_ENV: "https://x.invalid/s", trainjob_status.TOKEN_ENV: str(token)}
    assert trainjob_status.from_env(env={**env, "DDPKIT_TRAINJOB_STATUS": "0"}) is None
    p = trainjob_status.from_env(env=env)
    assert p is not None and p.token_file == str(token) and p.ca_file is None
    p.close()


def test_the_goodput_so_far_rides_along(server, pki, token, tmp_path):
    """A run dir with records: the post carries the goodput `ddpkit status` reports."""
    run = tmp_path / "run"
    t0 = time.time() - 100
    goodput.record(run, "attempt", time=t0)
    goodput.record(run, "ready", time=t0 + 10, step=0, load_s=0, fresh=True)
    goodput.record(run, "save", time=t0 + 60, step=50, blocking_s=1.0)
    env = {trainjob_status.URL_ENV: server.url, trainjob_status.CA_ENV: str(pki["ca"]),
           trainjob_status.TOKEN_ENV: str(token)}  # fmt: skip
    p = trainjob_status.from_env(run, env=env, total=100)
    assert p is not None
    p.update(60, metrics={"loss": 0.5})
    p.close()
    metrics = {
        m["name"]: m["value"] for m in server.requests[-1]["body"]["trainerStatus"]["metrics"]
    }
    want = goodput.report(run, now=time.time()).goodput
    assert abs(float(metrics["goodput"]) - want) < 0.02 and 0.4 < want < 0.6
    assert metrics["failures"] == "0" and metrics["loss"] == "0.5"


@pytest.fixture
def user_env(monkeypatch, server, pki, token, tmp_path):
    trainjob_status._user.clear()  # this process's poster for progress(): made anew here
    monkeypatch.setenv(trainjob_status.URL_ENV, server.url)
    monkeypatch.setenv(trainjob_status.CA_ENV, str(pki["ca"]))
    monkeypatch.setenv(trainjob_status.TOKEN_ENV, str(token))
    monkeypatch.setenv("DDPKIT_RUN_DIR", str(tmp_path / "run"))
    yield server
    poster = trainjob_status._user.get("poster")
    if poster is not None:
        poster.close()
    trainjob_status._user.clear()


def test_a_users_script_reports_with_one_call_on_rank_0(user_env, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    assert trainjob_status.progress(3, 30, loss=0.25, samples_per_s=512) is True
    wait_for(lambda: user_env.requests)
    trainjob_status._user["poster"].close()  # what atexit does at the end of the script
    first, final = user_env.requests[0], user_env.requests[-1]
    st = first["body"]["trainerStatus"]
    assert st["progressPercentage"] == 10
    assert {m["name"]: m["value"] for m in st["metrics"]} == {
        "state": "training", "step": "3", "total_steps": "30", "loss": "0.25",
        "samples_per_s": "512"}  # fmt: skip
    final_metrics = {m["name"]: m["value"] for m in final["body"]["trainerStatus"]["metrics"]}
    assert final_metrics["state"] == "stopped"  # step 3 of 30 when it ended


def test_other_ranks_and_a_pod_without_the_server_post_nothing(user_env, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert trainjob_status.progress(1, 10, loss=1.0) is False
    trainjob_status._user.clear()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv(trainjob_status.URL_ENV)
    assert trainjob_status.progress(1, 10, loss=1.0) is False
    time.sleep(0.1)
    assert user_env.requests == []


def test_the_kit_reporter_posts_its_logging_steps(server, pki, token, tmp_path, monkeypatch):
    """metrics.Reporter (rank 0's) with the server offered: each logged record's loss,
    samples/s and ETA, and the final state when the run closes it."""
    from ddpkit.train.metrics import Reporter

    for name, value in ((trainjob_status.URL_ENV, server.url),
                        (trainjob_status.CA_ENV, str(pki["ca"])),
                        (trainjob_status.TOKEN_ENV, str(token))):  # fmt: skip
        monkeypatch.setenv(name, value)
    rep = Reporter(tmp_path, True, 20, "plain")
    silent = Reporter(tmp_path / "x", False, 20, "plain")  # not rank 0: no poster
    assert silent.sinks == []
    rec = {"step": 10, "loss": 0.5, "lr": 1e-3, "grad_norm": 1.0, "throughput": 100.0,
           "throughput_unit": "samples/s", "samples_per_s": 100.0, "step_time_s": 0.64,
           "mem_bytes": 0, "epoch": 0, "time_s": 1.0, "mfu": None}  # fmt: skip
    rep.log(rec)
    wait_for(lambda: server.requests)
    rep.log({**rec, "step": 20, "loss": 0.25})
    rep.close()
    first = server.requests[0]["body"]["trainerStatus"]
    metrics = {m["name"]: m["value"] for m in first["metrics"]}
    assert first["progressPercentage"] == 50
    assert metrics == {"state": "training", "step": "10", "total_steps": "20", "loss": "0.5",
                       "lr": "0.001", "grad_norm": "1", "samples_per_s": "100",
                       "step_time_s": "0.64", "epoch": "0"}  # fmt: skip
    final = server.requests[-1]["body"]["trainerStatus"]
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0
    assert {"name": "loss", "value": "0.25"} in final["metrics"]
    assert {"name": "state", "value": "finished"} in final["metrics"]
