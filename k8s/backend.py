"""Kubernetes backend: a Kubeflow PyTorchJob (kubeflow.org/v1) or TrainJob (Trainer v2).

Manifests are built as dicts by small pure functions and dumped with the kit's safe dumper
(templating.dump_yaml_all), so every user string reaches the API server as that string (no
splicing into YAML; quoted where any YAML reader would take it for a number). Every pod runs
k8s/launch.sh (embedded as `bash -c`): wait for a TCP connection to the rendezvous
endpoint, then `exec torchrun ... -m ddpkit.train ...` with the rendezvous taken from the PET_*
variables the controller injects (facts/kubeflow.md). submit/status/logs/cancel use the
`kubernetes` client (imported when used).

Everything about Kubernetes, in this package and k8s/:
    __init__.py  the Backend subclass (the backend's entry points)
    render.py    the manifests (pure)
    checks.py    what a cluster would reject, refused at render time
    crds.py      the resources, and the TrainJob shape of each Kubeflow Trainer release
    api.py       submit/status/logs/list/cancel with the kubernetes client
    k8s/launch.sh (repository root)  the container command of every pod
"""

from __future__ import annotations

import argparse
import sys

from ddpkit.k8s.options import K8sOptions, validate_k8s
from ddpkit.k8s.render import (
    FILE_EXT,
    LAUNCH_SCRIPT,
    command,
    grace_period_s,
    manifests,
    render,
    volumes,
)
from ddpkit.tools.backends import Backend, JobStatus, user_image
from ddpkit.tools.jobspec import JobSpec

__all__ = ["LAUNCH_SCRIPT", "K8sBackend", "command", "manifests", "render", "volumes"]


class K8sBackend(Backend):
    name = "k8s"
    file_ext = FILE_EXT
    Options = K8sOptions  # the job file's [k8s] table
    make_vars = {"NAMESPACE": "namespace"}
    shares_filesystem = False  # inputs live in the image or on the PVC
    runs_torchft = True  # a replica group per pod, the lighthouse its own pod (render.py)

    def validate(self, spec: JobSpec) -> None:
        super().validate(spec)
        validate_k8s(spec)
        note = user_image.code_note(spec)  # the job's code and the image it names
        if note:
            print(note, file=sys.stderr)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-n", "--namespace", help="status/logs/cancel/list: the namespace")
        if "--follow" not in parser._option_string_actions:  # the launcher may define it
            parser.add_argument(
                "-f", "--follow", action="store_true", help="logs: stream every pod to the end"
            )

    def stop_window(self, spec: JobSpec) -> tuple[int, str]:
        return grace_period_s(spec), "the pods' terminationGracePeriodSeconds"

    def render(self, spec: JobSpec) -> str:
        return render(spec)

    def submit(self, spec: JobSpec, opts: argparse.Namespace) -> int:
        from ddpkit.k8s import api

        rc = api.submit(spec, manifests(spec), opts)
        if rc or not getattr(opts, "wait", False):
            return rc
        self._where = (spec.k8s.namespace, spec.k8s.api)
        return self.wait(spec.name, poll_s=5.0)

    def poll(self, job: str) -> JobStatus:
        from ddpkit.k8s import api

        ns, kind = getattr(self, "_where", None) or api.where(job)
        return api.poll(job, ns, kind)

    def status(self, job: str | None, opts: argparse.Namespace) -> int:
        from ddpkit.k8s import api

        return api.status(job, opts)

    def logs(self, job: str | None, opts: argparse.Namespace) -> int:
        from ddpkit.k8s import api

        return api.logs(job, opts)

    def cancel(self, job: str | None, opts: argparse.Namespace) -> int:
        from ddpkit.k8s import api

        return api.cancel(job, opts)

    def list_jobs(self, opts: argparse.Namespace) -> int:
        from ddpkit.k8s import api

        return api.list_jobs(opts)
