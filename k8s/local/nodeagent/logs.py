"""The kubelet endpoint the API server proxies `kubectl logs` to."""

from __future__ import annotations

import http.server
import os
import socketserver
import ssl
import threading
import time
import urllib.parse


class LogServer:
    """The Agent's log endpoint (a mixin)."""

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
