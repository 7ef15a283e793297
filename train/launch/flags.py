"""The node launcher's command line (python -m ddpkit.train.node [ddpkit flags] [torchrun
flags] -- ENTRY): its own flags, torchrun's flags parsed by torchrun's own parser, and every
number checked before anything starts, a bad one in one line (exit 2). train/node.py runs the
launch; this module only reads what it was asked to do. torch-free at import (torchrun's
parser is imported when the flags are parsed)."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from ddpkit.train.contract import DEFAULT_COLLECTIVE_TIMEOUT_S, DEFAULT_SHUTDOWN_TIMEOUT_S
from ddpkit.train.errors import CliParser, UserError, abbreviated, no_abbreviation


class NodeError(UserError):
    """A bad node-launcher invocation (one line, exit 2)."""


class _Parser(CliParser):
    error_class = NodeError


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m ddpkit.train.node",
        description="The one node launcher every backend runs: torchrun in process, one exit "
        "status out.",
        epilog="Every other flag before `--` is passed to torchrun (e.g. --nnodes 2 "
        "--nproc-per-node 4 --rdzv-endpoint head:29500 --rdzv-id job1, or --standalone).",
    )
    p.add_argument(
        "--run-dir",
        help="where a requeue marker is looked for (DDPKIT_RUN_DIR for the workers); "
        "default: the trainer's run dir, or runs/<script or module name> for another entry point",
    )
    p.add_argument(
        "--shutdown-timeout",
        "--shutdown_timeout",
        type=float,
        help="seconds the workers get after a stop signal (rounded up); default: "
        f"train's --shutdown-timeout-s, else {DEFAULT_SHUTDOWN_TIMEOUT_S:g}",
    )
    p.add_argument(
        "--collective-timeout",
        type=float,
        help="seconds a collective may wait for a rank before it fails (a hung rank ends the "
        "attempt within it, in the user's own script too: the default process-group timeout "
        f"of its workers); default: train's --timeout-s, else {DEFAULT_COLLECTIVE_TIMEOUT_S:g}",
    )
    p.add_argument(
        "--launch-id",
        help="id shared by every node of this launch (default: the rendezvous id, "
        "or a fresh one for --standalone)",
    )
    return p


def own_flags() -> list[str]:
    return list(build_parser()._option_string_actions)


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(launcher flags, entry point argv) around the first `--`."""
    if "--" not in argv:
        parse_flags(argv, ["entry.py"])  # a bad flag is named first, as with an entry point
        raise NodeError(
            "no entry point: put it after `--`, e.g. python -m ddpkit.train.node --standalone "
            "--nproc-per-node 2 -- -m ddpkit.train --steps 10"
        )
    i = argv.index("--")
    entry = argv[i + 1 :]
    if not entry or entry == ["-m"]:
        raise NodeError("empty entry point after `--`; give -m MODULE [args] or SCRIPT [args]")
    return argv[:i], entry


def parse_flags(flags: list[str], entry: list[str]) -> tuple[argparse.Namespace, Any]:
    """(the launcher's own flags, torchrun's args), every number checked: a bad one is one
    line naming the flag and what it accepts (exit 2), before anything starts."""
    own, torchrun_flags = build_parser().parse_known_args(flags)
    from torch.distributed import run as torchrun

    if any(f.split("=")[0] in ("--signals-to-handle", "--signals_to_handle") for f in flags):
        raise NodeError(
            "--signals-to-handle is set by the launcher (ddpkit.train.contract); drop it"
        )
    parser = torchrun.get_args_parser()

    def refuse(message: str) -> None:  # argparse's usage dump + SystemExit -> one line
        raise NodeError(f"torchrun flags: {message} (see torchrun --help)")

    parser.error = refuse  # type: ignore[method-assign]
    # torchrun itself takes a prefix of its flags (argparse's default); through ddpkit it does
    # not, as no ddpkit command does: `--nnode 2` would wait for a second node, `--node 1`
    # would set --node-rank. The kit's own scripts spell every flag whole.
    parser.allow_abbrev = False
    short = abbreviated(torchrun_flags, [*parser._option_string_actions, *own_flags()])
    if short:
        prog = build_parser().prog
        raise NodeError(f"{no_abbreviation(prog, *short)} (see {prog} --help)")
    args = parser.parse_args([*torchrun_flags, *entry])
    check_numbers(own, args, torchrun_flags)
    return own, args


def _flag(name: str, given: list[str]) -> str:
    """`--name`, or `--name (PET_NAME)` when the value came from torchrun's environment."""
    spelled = (f"--{name}", f"--{name.replace('-', '_')}")
    if any(f.split("=")[0] in spelled for f in given):
        return spelled[0]
    env = f"PET_{name.replace('-', '_').upper()}"
    return f"{spelled[0]} (from {env})" if env in os.environ else spelled[0]


def check_numbers(own: argparse.Namespace, args: argparse.Namespace, given: list[str]) -> None:
    """Every numeric flag in its range; torchrun itself would assert deep inside (a
    traceback), take the nonsense (a negative --node-rank), or hang on it."""
    from ddpkit.train.config import DURATION_MAX_S

    def bad(name: str, value: object, accepted: str) -> NodeError:
        shown = f"{value:g}" if isinstance(value, float) else value
        return NodeError(f"{_flag(name, given)} {shown}: must be {accepted}")

    nnodes = str(args.nnodes)
    parts = nnodes.split(":")
    if not (1 <= len(parts) <= 2 and all(p.strip().isdigit() for p in parts)) or not (
        1 <= int(parts[0]) <= int(parts[-1])
    ):
        raise bad("nnodes", nnodes, "a whole number >= 1, or MIN:MAX with 1 <= MIN <= MAX")
    max_nodes = int(parts[-1])
    nproc = str(args.nproc_per_node)
    if not (nproc in ("gpu", "cpu", "auto", "xpu") or (nproc.isdigit() and int(nproc) >= 1)):
        raise bad("nproc-per-node", nproc, "a whole number >= 1, or gpu, cpu, auto")
    if args.max_restarts < 0:
        raise bad("max-restarts", args.max_restarts, "a whole number >= 0")
    if not (math.isfinite(args.monitor_interval) and 0 < args.monitor_interval <= 3600):
        raise bad("monitor-interval", args.monitor_interval, "in (0, 3600] seconds")
    if not 0 <= int(args.node_rank) < max_nodes:
        raise bad("node-rank", args.node_rank, f"in 0..{max_nodes - 1} (--nnodes {nnodes})")
    if args.master_port is not None and not 1 <= int(args.master_port) <= 65535:
        raise bad("master-port", args.master_port, "a TCP port in 1..65535")
    for name in ("shutdown-timeout", "collective-timeout"):
        timeout = getattr(own, name.replace("-", "_"))
        if timeout is not None and not (math.isfinite(timeout) and 0 < timeout <= DURATION_MAX_S):
            raise bad(name, timeout, f"in (0, {DURATION_MAX_S}] seconds (a week)")


def planned_world(nnodes: str, nproc: str) -> tuple[int, int]:
    """(world size, nodes) this launch will have; elastic ranges use their maximum."""
    max_nodes = int(str(nnodes).split(":")[-1])
    if str(nproc).isdigit():
        per_node = int(nproc)
    else:  # "gpu"/"auto"/"cpu": torchrun's own rule
        from torch.distributed.run import determine_local_world_size

        per_node = determine_local_world_size(nproc)
    return max_nodes * per_node, max_nodes
