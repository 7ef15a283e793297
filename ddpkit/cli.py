"""The `ddpkit` command: every way in, from any directory (the user's project).

    ddpkit init [--script FILE | --module NAME | --model IMPORT] [--name N] [--force]
    ddpkit run [--config FILE] [--set KEY=VALUE ...] [--nproc N] [-- entry point flags]
    ddpkit render|submit|status|logs|cancel|list BACKEND [...]    BACKEND: local slurm k8s docker
    ddpkit build [--config FILE] [--base-image IMG]               the project's image (docker/k8s)
    ddpkit train [train flags]                                    the built-in trainer, this process
    ddpkit doctor|memory|commbench|ckpt|plot|chaos [...]          the tools

The job file defaults to ./ddpkit.toml (what `ddpkit init` writes), else the kit's
built-in default job. Its directory is the workspace: every relative path in it is
relative to that directory, on every backend (`--print-spec` shows the resolved spec).
Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module whose main(argv) runs it, one line of help). Lazy: `ddpkit --help` and
# every command import only what they use (torch stays out of render/status/list).
TOOLS = {
    "train": (
        "ddpkit.train.__main__",
        "the built-in trainer in this process (python -m ddpkit.train)",
    ),
    "node": (
        "ddpkit.train.launch.node",
        "the node launcher every backend runs (torchrun + the contract)",
    ),
    "doctor": ("ddpkit.tools.doctor.cli", "check this node: GPUs, NCCL, network, rendezvous"),
    "memory": ("ddpkit.tools.planner.cli", "plan memory per GPU for a job, a model or a size"),
    "commbench": ("ddpkit.tools.commbench", "measure collectives (run under torchrun)"),
    "ckpt": ("ddpkit.tools.ckpt", "inspect or export a checkpoint"),
    "plot": ("ddpkit.tools.plot", "PNG charts of runs' metrics.jsonl"),
    "chaos": (
        "ddpkit.tools.chaos",
        "a fault drill: inject failures into a job, report its goodput",
    ),
}
LAUNCH_ACTIONS = {
    "render": "print what submit would send to a backend (local, slurm, k8s, docker)",
    "submit": "send the job to a backend; --wait follows it to its end",
    "status": "one look at a job (default: the last one submitted from this workspace)",
    "logs": "a job's logs; --follow shows them as they grow, to the job's end",
    "cancel": "end a job (a save on the way out; never a requeue)",
    "list": "this user's ddpkit jobs on a backend",
}
OWN = {
    "init": "write a commented starter job file (ddpkit.toml) for the project here",
    "run": "run the job on this machine through the node launcher (= submit local)",
    "build": "build the project's image FROM the ddpkit image (= render docker --build)",
}


def usage() -> str:
    lines = [__doc__.strip().split("\n\n")[0], "", "commands:"]
    rows = [*OWN.items()]
    rows += [(a, text) for a, text in LAUNCH_ACTIONS.items()]
    rows += [(name, text) for name, (_, text) in TOOLS.items()]
    lines += [f"  {name:<10} {text}" for name, text in rows]
    lines += ["", "`ddpkit COMMAND --help` for a command's flags."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from ddpkit import __version__

        print(f"ddpkit {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    from ddpkit.train.errors import run_cli

    if command in LAUNCH_ACTIONS:
        from ddpkit.tools import submit

        return run_cli(lambda: submit.run([command, *rest]))
    if command == "run":
        from ddpkit.tools import submit

        return run_cli(lambda: submit.run_here(rest))
    if command == "build":
        from ddpkit.tools import submit

        return run_cli(lambda: submit.run(["render", "docker", "--build", "--quiet", *rest]))
    if command == "init":
        from ddpkit.tools import init

        return run_cli(lambda: init.main(rest))
    if command in TOOLS:
        module = importlib.import_module(TOOLS[command][0])
        return run_cli(lambda: int(module.main(rest) or 0))
    print(f"ddpkit: unknown command {command!r}; `ddpkit --help` lists them", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
