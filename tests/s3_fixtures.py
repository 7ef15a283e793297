"""The `s3_server` fixture: a real S3-compatible server (versitygw, tools/s3local), one per
test session, on loopback at a free port with throwaway credentials, its objects in a tmp dir.

The binary is built once per machine (tools/s3local/build.sh, into ~/.cache/ddpkit-s3);
.ci/run starts that build in the background, and build.sh's lock makes the fixture wait for
a running build instead of starting a second one. The credentials reach the server and the
tests through the environment only (S3Server.env), never a file in the checkout or a log.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
S3LOCAL = REPO / "tools" / "s3local"


def _binary() -> Path:
    out = subprocess.run(
        ["bash", "-c", f'source {S3LOCAL}/versions.sh; echo "$S3_BIN"'],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return Path(out.stdout.strip())


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    access: str
    secret: str
    data: Path  # the server's own files: bucket/key

    def env(self, access: str | None = None, secret: str | None = None) -> dict[str, str]:
        """The environment a client needs (wrong keys for the credentials tests)."""
        return {
            **os.environ,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": access or self.access,
            "AWS_SECRET_ACCESS_KEY": secret or self.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def fs(self):  # an s3fs client of this server (a fresh one: no cached listings)
        import s3fs

        return s3fs.S3FileSystem(
            key=self.access,
            secret=self.secret,
            endpoint_url=self.endpoint,
            client_kwargs={"region_name": "us-east-1"},
            skip_instance_cache=True,
            use_listings_cache=False,
        )

    def bucket(self, name: str) -> str:
        """Make a bucket; its URL."""
        fs = self.fs()
        if not fs.exists(name):  # no LocationConstraint: us-east-1 takes none
            fs.call_s3("create_bucket", Bucket=name)
        return f"s3://{name}"


def start(root: Path, host: str = "127.0.0.1") -> tuple[S3Server, subprocess.Popen]:
    """A server with its objects under root/data and fresh credentials (bench.objstore uses
    it too), listening on `host` (tests/engines/k8s/test_k8s_s3.py: the pod bridge's address, which
    the pods reach); builds the binary first when absent (waiting on a running build's lock)."""
    binary = _binary()
    if not binary.exists():  # waits on a running build's lock, else builds (minutes, once)
        build = subprocess.run(
            ["bash", str(S3LOCAL / "build.sh")],
            capture_output=True, text=True, check=False, timeout=3000,
        )  # fmt: skip
        if build.returncode != 0:
            raise RuntimeError(f"tools/s3local/build.sh failed:\n{build.stderr[-3000:]}")
    data = root / "data"
    data.mkdir(parents=True)
    access, secret = f"test{secrets.token_hex(6)}", secrets.token_hex(20)
    port = _free_port(host)
    with (root / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            [str(binary), "--port", f"{host}:{port}", "--region", "us-east-1", "posix", str(data)],
            env={**os.environ, "ROOT_ACCESS_KEY_ID": access, "ROOT_SECRET_ACCESS_KEY": secret},
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"versitygw exited {proc.returncode}; log in {root}")
        try:
            socket.create_connection((host, port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                stop(proc)
                raise RuntimeError(f"versitygw never listened on {port}; log in {root}") from None
            time.sleep(0.1)
    return S3Server(f"http://{host}:{port}", access, secret, data), proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    pytest.importorskip("s3fs", reason="s3fs is not installed (make setup installs it)")
    server, proc = start(tmp_path_factory.mktemp("s3"))
    try:
        yield server
    finally:
        stop(proc)
