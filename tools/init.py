"""`ddpkit init`: a commented starter job file (ddpkit.toml) for the project in this directory.

    ddpkit init                      # the entry point detected: train.py, main.py, or the one
                                     # script that calls init_process_group / ddpkit.train.fit
    ddpkit init --script src/run.py  # or name it: --script FILE, --module PKG.MOD,
    ddpkit init --model mypkg.models:build   # or the kit's trainer with your model

Nothing is overwritten without --force; the file is written whole or not at all.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from ddpkit.tools.backends.registry import BACKENDS, builtin_class
from ddpkit.tools.jobspec import JOB_FILE, MODULE_RE, NAME_RE, SpecError, load_spec
from ddpkit.train.errors import CliParser

COMMON = ("train.py", "main.py", "run.py")
SIGNS = re.compile(r"init_process_group|ddpkit\.train|from ddpkit\.train import fit")
SKIP = {".git", ".venv", "venv", "runs", ".ddpkit", "__pycache__", "node_modules"}


class _Parser(CliParser):
    error_class = SpecError


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ddpkit init", description=__doc__.split("\n\n")[0])
    who = p.add_mutually_exclusive_group()
    who.add_argument("--script", help="the entry point: a script, relative to this directory")
    who.add_argument("--module", help="the entry point: a module run as python -m MODULE")
    who.add_argument("--model", help="the kit's trainer with your model: pkg.module:factory")
    p.add_argument("--name", help="job name (default: this directory's name)")
    p.add_argument("--nproc", type=int, default=2, help="processes per node (default 2)")
    p.add_argument("--force", action="store_true", help=f"overwrite an existing {JOB_FILE}")
    return p


def detect_script(root: Path) -> str | None:
    """The project's training script: a common name first, else the one script that looks
    distributed. None when there is no such script, or several."""
    for name in COMMON:
        if (root / name).is_file():
            return name
    found = []
    for path in sorted(root.rglob("*.py")):
        if SKIP & set(path.relative_to(root).parts) or len(found) > 1:
            continue
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if SIGNS.search(text) and "__main__" in text:
            found.append(path.relative_to(root).as_posix())
    return found[0] if len(found) == 1 else None


def job_name(text: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:52].strip("-")
    return name if NAME_RE.match(name or "") else "job"


def render(name: str, nproc: int, entry: dict[str, str]) -> str:
    """The starter file: every line a user is likely to change, commented."""
    lines = [
        "# ddpkit job file for this project (written by `ddpkit init`). Paths are relative",
        "# to this file's directory (the workspace). Run it with:",
        "#   ddpkit run                        # here, through the node launcher",
        "#   ddpkit submit slurm --nodes 2     # on SLURM (runs in this directory)",
        "#   ddpkit build && ddpkit submit k8s # in an image built from this directory",
        "# `ddpkit render BACKEND --print-spec` shows every key with its resolved value.",
        f'name = "{name}"',
        f"nproc_per_node = {nproc}  # processes per node: one per GPU (gloo processes on CPU)",
        "nodes = 1",
        '# accelerator = "cpu"      # "gpu" (default) requests one GPU per process',
        '# time = "01:00:00"        # the scheduler\'s time limit',
        f'image = "{name}:latest"  # docker/k8s: `ddpkit build` makes it (this directory on the ddpkit image)',
        "# Where checkpoints go. Every entry point gets it as $DDPKIT_CKPT_DIR (the run dir as",
        "# $DDPKIT_RUN_DIR): save there, e.g. torch.save(state, os.environ['DDPKIT_CKPT_DIR'] +",
        "# '/last.pt'), and resume from it. On k8s/docker put it on a volume that outlives the pod",
        "# (k8s.pvc, docker's runs/ mount): a container's own disk is lost with it.",
        f'ckpt_dir = "runs/{name}/checkpoints"',
    ]
    if "script" in entry or "module" in entry:
        key = "script" if "script" in entry else "module"
        lines += [
            "",
            "# Your entry point, run unchanged under torchrun on every node:",
            f'{key} = "{entry[key]}"',
            'args = []  # its arguments, e.g. ["--epochs", "10"]',
            "",
            "[train]",
            '# run_dir = "runs/' + name + '"   # where the launcher looks for requeue markers',
            "# shutdown_timeout_s = 30  # time to save after a stop signal",
        ]
    else:
        lines += [
            "",
            "# The kit's trainer (`ddpkit train --help` lists every key):",
            "[train]",
            f'model = "{entry.get("model", "mlp")}"',
            'dataset = "synthetic"      # or mnist, cifar10, imagefolder, tokens, pkg.mod:fn',
            'parallel = "ddp"           # or "fsdp" (sharding = FULL_SHARD, HYBRID_SHARD, ...)',
            "batch_size = 64",
            "steps = 200",
            "lr = 1e-3",
            "ckpt_interval = 100",
        ]
    for name in BACKENDS:  # each engine's starter lines for its table (Backend.job_file_lines)
        table = builtin_class(name).job_file_lines
        if table:
            lines += ["", f"[{name}]", *table]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    root = Path.cwd()
    target = root / JOB_FILE
    if target.exists() and not args.force:
        raise SpecError(f"{JOB_FILE} exists already; edit it, or pass --force to overwrite it")
    if args.nproc < 1:
        raise SpecError(f"--nproc must be >= 1, got {args.nproc}")
    entry: dict[str, str] = {}
    if args.script:
        if not (root / args.script).is_file():
            raise SpecError(f"--script {args.script}: no such file in {root}")
        entry["script"] = Path(args.script).as_posix()
    elif args.module:
        if not MODULE_RE.match(args.module):
            raise SpecError(f"--module {args.module!r} is not a module path, e.g. mypkg.train")
        entry["module"] = args.module
    elif args.model:
        entry["model"] = args.model
    else:
        found = detect_script(root)
        if found is None:
            raise SpecError(
                "no training script found here (train.py, main.py, or one script calling "
                "init_process_group); name it: ddpkit init --script FILE (or --module, --model)"
            )
        entry["script"] = found
    name = job_name(args.name or root.name)
    text = render(name, args.nproc, entry)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text)
    try:
        load_spec(tmp, local_paths=False)  # what we write must load (without a GPU check)
    except SpecError:
        tmp.unlink()
        raise
    tmp.replace(target)
    what = (
        entry.get("script")
        or entry.get("module")
        or f"the kit trainer ({entry.get('model', 'mlp')})"
    )
    print(f"wrote {JOB_FILE}: job {name!r}, entry point {what}; next: ddpkit run")
    return 0
