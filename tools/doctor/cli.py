"""Check that this node (or, under torchrun/srun, every node) can run a distributed job.

    ddpkit doctor [--rdzv-endpoint HOST:PORT] [--ckpt-dir DIR] [--config FILE] [--json]
    torchrun --nnodes 2 --nproc-per-node 8 ... -m ddpkit.tools.doctor      # every rank, one report
    srun --ntasks-per-node 1 ddpkit doctor --rdzv-endpoint head:29500

Checks: torch/CUDA/NCCL versions, GPUs and CUDA_VISIBLE_DEVICES, /dev/shm size, memlock
and open-files limits, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME against the interfaces that
exist, InfiniBand devices, resolution of and a TCP connection to the rendezvous endpoint,
free space at the checkpoint path and, across nodes, clock skew and version mismatches.
Every finding that needs action comes with its fix. Exit status: 0 when nothing is fatal,
1 when something is (warnings too with --strict), 2 on bad input.

Under srun (no torchrun) rank 0 listens on the endpoint's port itself and every task
connects to it: that proves the port is reachable before the real job uses it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from ddpkit.slurm import step
from ddpkit.tools.doctor.checks import (
    Finding,
    check_disk,
    check_gpus,
    check_shm,
    check_versions,
    limits_findings,
    skew_finding,
)
from ddpkit.tools.doctor.net import (
    hostname_finding,
    ib_findings,
    ifname_findings,
    interfaces,
    parse_endpoint,
    rendezvous_findings,
)
from ddpkit.train.contract import default_ckpt_dir, default_run_dir
from ddpkit.train.errors import CliParser, UserError, run_cli

EXIT_FATAL = 1
DEFAULT_PORT = 29500


class DoctorError(UserError):
    """Bad input: the message names the problem and the fix."""


def launch_env() -> dict[str, Any]:
    """Rank layout from torchrun's or srun's environment (world size 1 when neither)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env):
        return {
            "launcher": "torchrun",
            "rank": int(env.get("RANK", 0)),
            "world": int(env.get("WORLD_SIZE", 1)),
            "local_rank": int(env.get("LOCAL_RANK", 0)),
            "local_world": int(env.get("LOCAL_WORLD_SIZE", 1)),
            "nnodes": int(env.get("GROUP_WORLD_SIZE", env.get("PET_NNODES", "1").split(":")[-1])),
        }
    srun = step.task_layout(env)  # a task of a SLURM job step (the engine reads srun's names)
    if srun is not None:
        return {"launcher": "srun", **srun}
    return {
        "launcher": "none",
        "rank": 0,
        "world": 1,
        "local_rank": 0,
        "local_world": 1,
        "nnodes": 1,
    }


def endpoint(args: argparse.Namespace, launcher: str) -> tuple[str, int] | None:
    env = os.environ
    if args.rdzv_endpoint:
        return parse_endpoint(args.rdzv_endpoint, DEFAULT_PORT)
    if launcher == "torchrun" and env.get("MASTER_ADDR"):  # the store torchrun's agent hosts
        return env["MASTER_ADDR"], int(env.get("MASTER_PORT", DEFAULT_PORT))
    if env.get("PET_RDZV_ENDPOINT"):
        return parse_endpoint(env["PET_RDZV_ENDPOINT"], DEFAULT_PORT)
    host = env.get("MASTER_ADDR") or env.get("PET_MASTER_ADDR")
    if launcher == "srun":
        host = host or step.head_node(env)
    if host:
        return host, int(env.get("MASTER_PORT") or env.get("PET_MASTER_PORT") or DEFAULT_PORT)
    return None


def ckpt_settings(args: argparse.Namespace) -> tuple[str, int | None]:
    """(checkpoint dir, bytes the kept checkpoints need or None)."""
    ckpt, need = args.ckpt_dir, None
    if args.config:
        from ddpkit.train.config import ConfigError, TrainConfig, load_toml

        try:
            values = load_toml(args.config)
        except ConfigError as e:
            raise DoctorError(str(e)) from None
        cfg = TrainConfig(**values)
        run_dir = cfg.run_dir or default_run_dir(cfg.name)
        ckpt = ckpt or cfg.ckpt_dir or default_ckpt_dir(run_dir)
        if args.params is None:
            from ddpkit.tools.planner.model import describe_model

            ns = argparse.Namespace(model=None, config=args.config)
            try:
                args.params = describe_model(ns).num_params
            except ValueError as e:
                raise DoctorError(f"--config {args.config}: {e}") from None
        keep = cfg.ckpt_keep
    else:
        keep = 3
    if args.params is not None:
        need = 12 * int(args.params) * (keep + 1)  # fp32 params + Adam's two moments, K+1 kept
    return ckpt or "runs", need


def local_checks(
    args: argparse.Namespace,
    lay: dict[str, Any],
    ep: tuple[str, int] | None,
    ckpt: tuple[str, int | None],
) -> list[Finding]:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ib_dir = Path("/sys/class/infiniband")
    ib = ib_dir.is_dir() and any(ib_dir.iterdir())
    import resource

    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    multi = lay["nnodes"] > 1
    found = check_versions() + check_gpus(lay["local_rank"], lay["local_world"])
    found.append(check_shm(gpus))
    found += limits_findings(memlock, nofile, ib, gpus)
    found += ifname_findings(dict(os.environ), interfaces(), multi)
    env = os.environ
    found += ib_findings(ib_dir, env.get("NCCL_IB_HCA"), env.get("NCCL_IB_DISABLE") == "1")
    found.append(hostname_finding(multi, env.get("GLOO_SOCKET_IFNAME")))
    if ep is None:
        found.append(
            Finding(
                "rdzv", "info", "no rendezvous endpoint to check; pass --rdzv-endpoint HOST:PORT"
            )
        )
    else:
        found += rendezvous_findings(ep[0], ep[1], args.connect_timeout, multi)
    found.append(check_disk(*ckpt))
    return found


def render(reports: list[dict[str, Any]], cluster: list[Finding], lay: dict[str, Any]) -> str:
    hosts: dict[str, list[dict[str, Any]]] = {}
    for r in reports:
        hosts.setdefault(r["host"], []).append(r)
    lines = [
        f"ddpkit doctor: {len(reports)} rank(s) on {len(hosts)} node(s), launcher {lay['launcher']}"
    ]

    def show(f: dict[str, Any], prefix: str = "") -> None:
        tag = {"ok": "ok  ", "info": "info", "warn": "WARN", "fail": "FAIL"}[f["level"]]
        lines.append(f"  {tag}  {prefix}{f['check']:<13} {f['message']}")
        if f.get("fix") and f["level"] in ("warn", "fail"):
            lines.append(f"        fix: {f['fix']}")

    for host, ranks in hosts.items():
        ids = [r["rank"] for r in ranks]
        lines.append(f"== {host} (rank{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}) ==")
        for f in ranks[0]["findings"]:
            if f["scope"] == "node":
                show(f)
        for r in ranks:
            for f in r["findings"]:
                if f["scope"] == "rank":
                    show(f, f"rank {r['rank']}: ")
    if cluster:
        lines.append("== across nodes ==")
        for c in cluster:
            show(c.as_dict())
    return "\n".join(lines)


def distinct(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings as the report shows them: node findings once per host, rank ones per rank."""
    out, hosts = [], set()
    for r in reports:
        out += [f for f in r["findings"] if f["scope"] == "rank" or r["host"] not in hosts]
        hosts.add(r["host"])
    return out


def cross_rank(reports: list[dict[str, Any]], times: dict[str, float]) -> list[Finding]:
    out = [skew_finding(times)]
    for key in ("torch", "cuda", "nccl"):
        seen: dict[str, list[str]] = {}
        for r in reports:
            seen.setdefault(r["versions"].get(key, "?"), []).append(r["host"])
        if len(seen) > 1:
            detail = "; ".join(f"{v} on {', '.join(sorted(set(h)))}" for v, h in seen.items())
            out.append(
                Finding(
                    "versions",
                    "fail",
                    f"{key} differs between nodes: {detail}",
                    "run the same image/environment on every node",
                )
            )
    return out


def build_parser() -> argparse.ArgumentParser:
    p = CliParser(
        prog="ddpkit doctor",
        description="Find what will break a distributed job on this node (or every node).",
    )
    p.add_argument(
        "--rdzv-endpoint",
        help="HOST[:PORT] to resolve and connect to (default: "
        "MASTER_ADDR:MASTER_PORT, PET_RDZV_ENDPOINT, or the SLURM head node)",
    )
    p.add_argument("--connect-timeout", type=float, default=5.0, help="seconds to keep trying")
    p.add_argument("--ckpt-dir", help="checkpoint path to check (default: runs, or from --config)")
    p.add_argument("--config", help="job/training TOML: its checkpoint dir and model size")
    p.add_argument("--params", type=float, help="parameter count, to size the checkpoints")
    p.add_argument("--timeout-s", type=float, default=60.0, help="wait for the other ranks")
    p.add_argument("--strict", action="store_true", help="warnings also make the exit status 1")
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_cli(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    lay = launch_env()
    args = build_parser().parse_args(argv)
    if args.connect_timeout <= 0 or args.timeout_s <= 0:
        raise DoctorError("--connect-timeout and --timeout-s must be > 0 seconds")
    try:
        ep = endpoint(args, lay["launcher"])
    except ValueError as e:
        raise DoctorError(f"{e}; pass --rdzv-endpoint HOST:PORT") from None
    ckpt = ckpt_settings(args)  # a bad --config fails here, before any check runs
    store, listen_error = None, None
    if lay["launcher"] == "srun" and lay["rank"] == 0 and ep is not None:
        from torch.distributed import TCPStore  # rank 0 listens: the others' connect check hits it

        try:
            store = TCPStore("0.0.0.0", ep[1], lay["world"], True, wait_for_workers=False)
        except (RuntimeError, OSError) as e:
            listen_error = Finding(
                "rdzv-listen",
                "fail",
                f"cannot listen on port {ep[1]} ({str(e).splitlines()[0]})",
                "the port is taken (a job's store already runs there?): pick a free port",
            )
    findings = local_checks(args, lay, ep, ckpt)
    if listen_error:
        findings.append(listen_error)
    report = {
        "rank": lay["rank"],
        "host": socket.gethostname(),
        "local_rank": lay["local_rank"],
        "versions": next(f.data for f in findings if f.check == "versions"),
        "findings": [f.as_dict() for f in findings],
    }
    reports, cluster = [report], []
    # torchrun's own store joins the ranks; under srun the doctor's store on the endpoint does.
    reachable = lay["launcher"] == "torchrun" or all(
        f.level != "fail" for f in findings if f.check.startswith("rdzv")
    )
    if lay["world"] > 1 and reachable and ep is not None:
        if any(f.check == "gloo-ifname" and f.level == "fail" for f in findings):
            os.environ.pop("GLOO_SOCKET_IFNAME")  # reported above; the gather goes without it
        try:
            reports, cluster = gather(report, lay, ep, args.timeout_s, store)
        except Exception as e:  # noqa: BLE001 (a broken network must still give a report)
            msg = f"could not gather the other ranks' reports ({type(e).__name__}: {e})"
            fix = "fix the findings above; every rank prints its own report meanwhile"
            cluster.append(Finding("gather", "fail", msg.splitlines()[0], fix))
    elif lay["world"] > 1:
        cluster.append(
            Finding(
                "gather", "warn", "the rendezvous is unreachable: each rank reports alone", None
            )
        )
    bad = {"fail"} | ({"warn"} if args.strict else set())
    shown = distinct(reports) + [c.as_dict() for c in cluster]
    fatal = sum(f["level"] in bad for f in shown)
    code = EXIT_FATAL if fatal else 0
    if lay["rank"] == 0 or len(reports) == 1:  # alone: every rank prints its own
        if args.json:
            doc = {"launcher": lay["launcher"], "ranks": reports, "exit": code}
            doc["cross_node"] = [c.as_dict() for c in cluster]
            print(json.dumps(doc, indent=2))
        else:
            print(render(reports, cluster, lay))
            warns = sum(f["level"] == "warn" for f in shown)
            print(f"result: {fatal} fatal finding(s), {warns} warning(s) -> exit {code}")
    return code


def gather(
    report: dict[str, Any], lay: dict[str, Any], ep: tuple[str, int], timeout: float, store: Any
) -> tuple[list[dict[str, Any]], list[Finding]]:
    """Every rank's report to every rank (gloo: works whatever state NCCL is in)."""
    import datetime

    import torch.distributed as dist

    kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout)}
    if lay["launcher"] == "srun":
        from torch.distributed import TCPStore

        if store is None:
            store = TCPStore(ep[0], ep[1], lay["world"], False, timeout=kwargs["timeout"])
        kwargs.update(store=store, rank=lay["rank"], world_size=lay["world"])
    dist.init_process_group("gloo", **kwargs)
    try:
        dist.barrier()
        stamp = (report["host"], time.time())  # read right after the barrier releases
        stamps: list[Any] = [None] * lay["world"]
        dist.all_gather_object(stamps, stamp)
        reports: list[Any] = [None] * lay["world"]
        dist.all_gather_object(reports, report)
    finally:
        dist.destroy_process_group()
    times: dict[str, float] = {}
    for host, t in stamps:
        times[host] = min(times.get(host, t), t)
    return reports, cross_rank(reports, times)
