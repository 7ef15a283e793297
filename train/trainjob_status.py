"""Progress in the TrainJob's own status (`kubectl get trainjob NAME -o yaml`:
`status.trainerStatus`), posted to Kubeflow Trainer's status server.

Trainer 2.2+ with its `TrainJobStatus` feature on (alpha, off by default: the controller's
`--feature-gates=TrainJobStatus=true`) gives every container of a TrainJob's trainer pods
(kubeflow/trainer v2.3.0, pkg/runtime/framework/plugins/trainjobstatus):

    KUBEFLOW_TRAINER_SERVER_URL      https://<svc>.<ns>.svc:10443/apis/trainer.kubeflow.org/
                                     v1alpha1/namespaces/<ns>/trainjobs/<name>/status
    KUBEFLOW_TRAINER_SERVER_CA_CERT  a file: the CA of the server's certificate
    KUBEFLOW_TRAINER_SERVER_TOKEN    a file: a service-account token good for that TrainJob
                                     only (the kubelet rotates it: read at every post)

and takes `POST {"trainerStatus": {progressPercentage, estimatedRemainingSeconds, metrics:
[{name, value}], lastUpdatedTime}}` (64 KiB at most; each post replaces the whole status by
server-side apply, so every post carries every field). Global rank 0 posts, nobody else.

The kit's trainer posts from its logging steps (metrics.Reporter); a user's own script calls

    from ddpkit.train import trainjob_status
    trainjob_status.progress(step, total, loss=loss.item(), samples_per_s=rate)

Never fails or slows training: the training thread only hands the newest values to a
background thread (a newer value replaces one not yet sent; nothing waits on the network),
which posts at most every 5 s with a 3 s timeout, and once more at the end with the final
state. A post that fails prints one warning line; later ones are quiet. Torch-free: the
standard library's urllib.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ddpkit.train.contract import RUN_DIR_ENV

URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
SWITCH_ENV = "DDPKIT_TRAINJOB_STATUS"  # "0": never post, even where the server is offered
# Trainer 2.3's server has no rate limit of its own and every post is a server-side apply
# to the API server: the client keeps its pace (Transformers' callback and the Kubeflow
# SDK use 5 s too).
MIN_INTERVAL_S = 5.0
TIMEOUT_S = 3.0  # the server answers in milliseconds when it is there
CLOSE_WAIT_S = 2.0  # how long the end of a run waits for its final post
MAX_BODY = 64 * 1024  # the server's limit (413 above it)
MAX_METRICS, MAX_LEN = 256, 64  # the CRD's: 256 metrics, names and values of 1-64 chars

# What a kit logging step's record (metrics.Reporter.log) shows as metrics, in this order.
RECORD_METRICS = ("loss", "lr", "grad_norm", "samples_per_s", "step_time_s", "epoch", "mfu")


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def metric_value(v: Any) -> str | None:
    """A metric's value as the CRD takes it (a string of 1-64 chars); None: leave it out."""
    if v is None:
        return None
    if isinstance(v, bool):
        s = str(v).lower()
    elif isinstance(v, float):
        s = f"{v:.6g}" if math.isfinite(v) else str(v)
    else:
        s = str(v)
    return s[:MAX_LEN] or None


def status_body(
    step: int, total: int | None, eta_s: float | None, metrics: Mapping[str, Any], now: float
) -> dict[str, Any]:
    """The request body for `step` of `total`: progress in whole percent (99 at most before
    the last step, so 100 means done), the ETA in whole seconds, the metrics as strings."""
    status: dict[str, Any] = {}
    if total and total > 0:
        pct = math.floor(100 * step / total)
        status["progressPercentage"] = max(0, min(100 if step >= total else 99, pct))
    if eta_s is not None and math.isfinite(eta_s):
        status["estimatedRemainingSeconds"] = max(0, min(2**31 - 1, round(eta_s)))
    items = []
    for name, value in metrics.items():
        text = metric_value(value)
        if text is not None and str(name):
            items.append({"name": str(name)[:MAX_LEN], "value": text})
    status["metrics"] = items[:MAX_METRICS]
    status["lastUpdatedTime"] = rfc3339(now)
    return {"trainerStatus": status}


def goodput_metrics(run_dir: str | Path) -> dict[str, Any]:
    """The run's goodput so far, as `ddpkit status` reports it (the run dir's records)."""
    from ddpkit.train.goodput import report

    rep = report(run_dir, now=time.time())
    if rep is None:
        return {}
    out: dict[str, Any] = {}
    if rep.goodput is not None:
        out["goodput"] = round(rep.goodput, 4)
    out.update(lost_s=round(rep.lost_s, 1), failures=len(rep.failures), attempts=rep.attempts)
    return out


class Poster:
    """Posts the newest progress to the status server from a thread of its own."""

    def __init__(
        self,
        url: str,
        ca_file: str | None = None,
        token_file: str | None = None,
        *,
        interval_s: float = MIN_INTERVAL_S,
        timeout_s: float = TIMEOUT_S,
        total: int | None = None,
        extra: Callable[[], Mapping[str, Any]] | None = None,
        warn: Callable[[str], None] | None = None,
    ):
        self.url, self.ca_file, self.token_file = url, ca_file, token_file
        self.total = total  # the run's steps, where an update does not say
        self.interval_s, self.timeout_s, self.extra = interval_s, timeout_s, extra
        self.warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.posted = self.failed = 0
        self.last_ok: bool | None = None  # the last post's outcome (None: none yet)
        self._cond = threading.Condition()
        self._pending: dict[str, Any] | None = None  # the newest values not yet sent
        self._last: dict[str, Any] | None = None  # the newest values, sent or not
        self._due = 0.0  # monotonic time before which no post goes (after the first)
        self._closing = False
        self._pace: tuple[float, int] | None = None  # (monotonic, step) of the first update
        self._opener: Any = None  # urllib's, made in the thread (its import is not free)
        self._thread = threading.Thread(target=self._run, name="ddpkit-trainjob-status")
        self._thread.daemon = True  # a process that ends never waits for a post
        self._thread.start()

    # --- the training thread's side: never waits on the network ---------------------------

    def update(
        self,
        step: int,
        total: int | None = None,
        eta_s: float | None = None,
        metrics: Mapping[str, Any] | None = None,
    ) -> None:
        """The newest progress; posted when the last post is `interval_s` old."""
        total = total or self.total
        now = time.monotonic()
        if eta_s is None:
            eta_s = self._eta(now, step, total)
        values = {"step": step, "total": total, "eta_s": eta_s, "metrics": dict(metrics or {})}
        with self._cond:  # held only to swap a dict: the thread never posts holding it
            if self._closing:
                return
            # Wake the thread when it can post now, or when it was waiting for anything at
            # all (it then sleeps until the post is due): at most one wake-up per post.
            if self._pending is None or now >= self._due:
                self._cond.notify()
            self._pending = self._last = values

    def log(self, rec: Mapping[str, Any]) -> None:
        """A kit logging step's record (metrics.Reporter.log, its ETA included)."""
        total = self.total
        metrics: dict[str, Any] = {"state": "training", "step": rec["step"], "total_steps": total}
        metrics.update((k, rec[k]) for k in RECORD_METRICS if rec.get(k) is not None)
        if rec.get("throughput_unit") == "tokens/s":
            metrics["tokens_per_s"] = rec.get("throughput")
        self.update(rec["step"], total, rec.get("eta_s"), metrics)

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Post the final state with the newest values (state `finished` at the last step,
        `stopped` before it, `ended` with no total) and wait for it up to `wait_s`; not at
        all when the last post failed."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            last = self._last
            if last is not None:
                done = bool(last["total"]) and last["step"] >= last["total"]
                state = "finished" if done else "stopped" if last["total"] else "ended"
                metrics = {**last["metrics"], "state": state}
                self._pending = {**last, "metrics": metrics, "eta_s": 0.0 if done else None}
            self._cond.notify()
        self._thread.join(wait_s if self.last_ok is not False else 0.0)

    def _eta(self, now: float, step: int, total: int | None) -> float | None:
        """Seconds to `total` at the pace since this poster's first update."""
        if self._pace is None or step <= self._pace[1]:
            self._pace = self._pace or (now, step)
            return None
        if not total:
            return None
        t0, s0 = self._pace
        return max(0.0, (now - t0) / (step - s0) * (total - step))

    # --- the posting thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closing and (self._pending is None or time.monotonic() < self._due):
                    wait = None if self._pending is None else self._due - time.monotonic()
                    self._cond.wait(wait)
                values, self._pending = self._pending, None
                closing = self._closing
            if values is not None:
                self._post(values)
                self._due = time.monotonic() + self.interval_s
            if closing:
                return

    def _post(self, values: dict[str, Any]) -> None:
        try:
            metrics = dict(values["metrics"])
            if self.extra is not None:
                with contextlib.suppress(Exception):  # accounting never stops the status
                    metrics.update(self.extra())
            body = status_body(values["step"], values["total"], values["eta_s"], metrics,
                               time.time())  # fmt: skip
            data = json.dumps(body).encode()
            while len(data) > MAX_BODY and body["trainerStatus"]["metrics"]:
                body["trainerStatus"]["metrics"].pop()
                data = json.dumps(body).encode()
            headers = {"Content-Type": "application/json"}
            if self.token_file:  # the credential goes in this header only, never to a log
                headers["Authorization"] = "Bearer " + Path(self.token_file).read_text().strip()
            import urllib.request

            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            with self._connection().open(req, timeout=self.timeout_s) as r:
                r.read(MAX_BODY)
        except Exception as e:  # no failure of the status may reach training
            self.failed += 1
            if self.failed == 1:
                self.warn(
                    f"warning: TrainJob status not posted to {self.url}: {_why(e)}; "
                    "training goes on without it (later failures are not printed)"
                )
            self.last_ok = False
            return
        self.posted += 1
        self.last_ok = True

    def _connection(self) -> Any:
        if self._opener is None:
            import ssl
            import urllib.request

            ctx = ssl.create_default_context(cafile=self.ca_file or None)
            # No proxy: the server is the cluster's own Service, which a pod's HTTPS_PROXY
            # (for the internet) would not reach.
            self._opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
            )
        return self._opener


def _why(e: BaseException) -> str:
    """A failed post in a few words: the server's status and message, or the network's."""
    import urllib.error

    if isinstance(e, urllib.error.HTTPError):
        msg = ""
        with contextlib.suppress(Exception):
            msg = str(json.loads(e.read(4096) or b"{}").get("message") or "")
        return f"HTTP {e.code}" + (f" ({msg[:200]})" if msg else "")
    if isinstance(e, urllib.error.URLError):
        e = e.reason if isinstance(e.reason, BaseException) else e
    if isinstance(e, TimeoutError):
        return "no answer within the timeout"
    return f"{type(e).__name__}: {e}"[:300]


def from_env(
    run_dir: str | Path | None = None, env: Mapping[str, str] | None = None, **kwargs: Any
) -> Poster | None:
    """A Poster when this pod was given the status server (and DDPKIT_TRAINJOB_STATUS is not
    0); its metrics then include the goodput of the run in `run_dir`. Else None."""
    env = os.environ if env is None else env
    url = env.get(URL_ENV, "").strip()
    if not url or env.get(SWITCH_ENV, "").strip() == "0":
        return None
    if run_dir is not None:
        kwargs.setdefault("extra", lambda: goodput_metrics(run_dir))
    return Poster(url, env.get(CA_ENV) or None, env.get(TOKEN_ENV) or None, **kwargs)


# --- a user's own script --------------------------------------------------------------------

_user: dict[str, Any] = {}  # this process's Poster for progress(), made at its first call
_user_lock = threading.Lock()


def progress(
    step: int, total: int | None = None, *, eta_s: float | None = None, **metrics: Any
) -> bool:
    """Tell the TrainJob's status where a user's script is: `step` of `total`, its metrics
    (loss=..., samples_per_s=..., any name: numbers or short strings). Call it as often as
    you like, from every rank (only global rank 0 posts, at most every 5 s, from a thread;
    the final state goes at exit). The ETA is the pace since the first call unless given.
    Returns True where the status server is there to post to (else it does nothing)."""
    with _user_lock:
        if "poster" not in _user:
            poster = None
            if os.environ.get("RANK", "0").strip() in ("", "0"):
                poster = from_env(os.environ.get(RUN_DIR_ENV) or None)
            if poster is not None:
                atexit.register(poster.close)
            _user["poster"] = poster
    poster = _user["poster"]
    if poster is None:
        return False
    shown = {"state": "training", "step": step, "total_steps": total, **metrics}
    poster.update(step, total, eta_s, shown)
    return True
