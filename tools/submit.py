"""One CLI for every backend:

    ddpkit {render,submit,status,logs,cancel,list} {local,slurm,k8s,docker,<plugin>} [SCRIPT|JOB]
        [--config FILE] [--set key=value ...] [--nodes N] [--gpus N] [--write] [--wait]
        [--watch [--every S]] [--print-spec] [-- extra flags for the entry point]

The job file defaults to ./ddpkit.toml, else the kit's built-in default job; its directory
is the workspace, where the job runs and its records live (.ddpkit/, runs/).
render prints exactly what submit sends; --write also saves it under .ddpkit/rendered/.
The job's training flags are checked by the trainer's own validation before anything is
rendered or queued. Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from ddpkit.tools.jobspec import BUILTIN_JOB, NAME_RE, JobSpec, SpecError, default_job_file
from ddpkit.train.errors import CliParser

ACTIONS = ("render", "submit", "status", "logs", "cancel", "list")


class _Parser(CliParser):
    error_class = SpecError


def build_parser(backend: object | None = None, prog: str | None = None) -> argparse.ArgumentParser:
    """The launcher's flags; prog set (`ddpkit run`): the action and backend are fixed."""
    from ddpkit.tools.backends import registered

    p = _Parser(prog=prog or "ddpkit", description=__doc__.split("\n\n")[0], epilog=EPILOG)
    if prog is None:
        p.add_argument("action", choices=ACTIONS)
        p.add_argument("backend", choices=list(registered()))  # built-in and plugin backends
        p.add_argument(
            "job",
            nargs="?",
            help="render/submit: your script (SCRIPT.py, the job file optional, like "
            "`torchrun SCRIPT.py`); status/logs/cancel: job id (default: the last one)",
        )
    else:
        p.add_argument("script", nargs="?", help=SCRIPT_HELP)
    p.add_argument(
        "--config", help="job file (TOML); default ./ddpkit.toml, else the built-in default job"
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a dotted key of the job file, e.g. slurm.partition=gpu, train.lr=3e-4",
    )
    p.add_argument(
        "--sweep",
        dest="sweeps",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="render/submit one job per combination (product over several --sweep keys), "
        "named <name>-<i>, each with its own run dir; SLURM: one job array",
    )
    p.add_argument("--nodes", type=int, help="number of nodes")
    p.add_argument("--gpus", type=int, help="processes per node (one per GPU)")
    p.add_argument(
        "--write", action="store_true", help="render: also write .ddpkit/rendered/<backend>/"
    )
    p.add_argument("--wait", action="store_true", help="submit: follow the job to its end")
    p.add_argument(
        "--watch",
        action="store_true",
        help="status: look again every --every seconds until the job ends, in place on a "
        "terminal (progress bar, ETA, samples/s, goodput, failures, the slowest rank); "
        "one plain line per change when piped",
    )
    p.add_argument(
        "--every",
        type=float,
        default=2.0,
        metavar="S",
        help="status --watch: seconds between looks",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="render/submit: first build the job's model on the meta device at its world size "
        "(ddpkit memory --dry-run) and refuse, in one line, what the nodes would refuse after "
        "the queue wait (a mesh that does not divide, data smaller than one global batch)",
    )
    p.add_argument("--print-spec", action="store_true", help="print the resolved spec, exit")
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="render: do not print the text (--write, --build)",
    )
    if backend is not None:
        backend.add_arguments(p)  # type: ignore[attr-defined]
    p.usage = p.format_usage().removeprefix("usage: ").rstrip() + " [-- ARGS ...]"
    return p


SCRIPT_HELP = (
    "your script, e.g. train.py (like `torchrun train.py`): runs it with the job file's "
    "settings, or without one with the flags given here"
)
EPILOG = (
    "-- ARGS: everything after `--` goes to the entry point (your script or module, or the "
    "kit trainer), e.g. `ddpkit run train.py -- --epochs 2`."
)


def _unknown_flags(argv: list[str], unknown: list[str], entry: list[str], shown: str) -> str:
    """The one line for flags the launcher does not know: they are the entry point's, and
    go after `--` (the command as it should have been typed)."""
    known = set(build_parser()._option_string_actions) | {"--plot"}
    start = argv.index(unknown[0]) if unknown[0] in argv else len(argv)
    end = next(
        (i for i in range(start + 1, len(argv)) if argv[i].split("=")[0] in known), len(argv)
    )
    ours = [a for a in argv[:start] + argv[end:] if a != "--plot" or shown != "ddpkit run"]
    fixed = " ".join([shown, *([shlex.join(ours)] if ours else []), "--",
                      shlex.join([*argv[start:end], *entry])])  # fmt: skip
    return (
        f"{shown}: unrecognized arguments: {' '.join(unknown)}; flags for your script or "
        f"module go after `--`: {fixed}"
    )


def _split_entry_args(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


# Make variables, read from the environment by `--make` (the Makefile exports them): values
# reach the launcher as data, never as recipe shell text (issue 13 item 7).
# The engines add their own (Backend.make_vars: PARTITION, NAMESPACE).
MAKE_VARS = ("CONFIG", "NODES", "GPUS", "NPROC", "IMAGE", "WAIT", "ARGS", "JOB")


def _make_sets() -> dict[str, str]:
    """Make variable -> the job file key it sets: the built-in engines' (Backend.make_vars),
    then IMAGE."""
    from ddpkit.tools.backends.registry import BACKENDS, builtin_class

    sets = {}
    for name in BACKENDS:
        sets |= {var: f"{name}.{key}" for var, key in builtin_class(name).make_vars.items()}
    return sets | {"IMAGE": "image"}


def make_argv(argv: list[str], env: dict[str, str]) -> list[str]:
    """`ACTION BACKEND --make [flags]` -> the launcher argv the Make variables stand for."""
    action, backend, rest = argv[0], argv[1], [a for a in argv[2:] if a != "--make"]
    sets = _make_sets()
    get = {k: env.get(k, "") for k in (*MAKE_VARS, *sets)}
    out = [action, backend]
    if get["JOB"] and action in ("status", "logs", "cancel"):
        out.append(get["JOB"])
    if action in ("render", "submit"):
        out += ["--config", get["CONFIG"] or default_job_file()]
    if get["NODES"]:
        out += ["--nodes", get["NODES"]]
    gpus = get["NPROC"] if backend == "local" and get["NPROC"] else get["GPUS"]
    if gpus:
        out += ["--gpus", gpus]
    for var, key in sets.items():
        if get[var]:
            out += ["--set", f"{key}={get[var]}"]
    if get["WAIT"] and action == "submit":
        out.append("--wait")
    out += rest
    if get["ARGS"]:
        try:
            words = shlex.split(get["ARGS"])
        except ValueError as e:
            raise SpecError(
                f"ARGS={get['ARGS']!r} does not split into words ({e}); fix the quotes"
            ) from None
        out += ["--", *words]
    return out


def run(argv: list[str], shown: str | None = None) -> int:
    """shown: the command as the user typed it (`ddpkit run`), for the messages; argv then
    starts with the action and backend it stands for."""
    if "--make" in argv[2:]:
        argv = make_argv(argv, dict(os.environ))
    argv, entry_args = _split_entry_args(argv)
    from ddpkit.tools.backends import load_backend, plugin_sections, registered

    if {"-h", "--help"} & set(argv) and len(argv) > 1 and argv[1] in registered():
        build_parser(load_backend(argv[1])).parse_args(argv)  # the help lists its own flags
    # The first pass reads the common flags (backend flags stay unknown, abbreviations are the
    # second pass's to refuse); the spec is checked before submitit or the kubernetes client is
    # imported (backends import them on use).
    parser = build_parser()
    parser.refuse_abbreviations = False  # type: ignore[attr-defined]
    first, _ = parser.parse_known_intermixed_args(argv)
    from ddpkit.tools.backends.node_checks import check_entry_point
    from ddpkit.tools.jobspec import load_spec

    checked: set[tuple[str | None, str | None, str]] = set()
    backend = load_backend(first.backend)  # light: engines' clients are imported on use
    sections = plugin_sections(backend)  # [mine] tables: typed for this backend, kept for others
    opts, unknown = build_parser(backend).parse_known_intermixed_args(argv)
    if unknown and first.action == "logs" and {"-f", "--follow"} & set(unknown):
        raise SpecError(
            f"the {backend.name} backend cannot follow a job's log (it has no --follow); "
            f"`ddpkit logs {backend.name}` shows it as it is now"
        )
    if unknown:
        words = argv[2:] if shown else argv
        raise SpecError(_unknown_flags(words, unknown, entry_args, shown or "ddpkit"))
    script = opts.job if first.action in ("render", "submit") else None
    script_sets = [] if script is None else _script_sets(script, first.config)
    config = first.config or default_job_file()
    demo = config == BUILTIN_JOB and not first.config  # no job file here, none given
    if script is not None and config == BUILTIN_JOB:
        config, demo = None, False  # an empty job: the script, the defaults, the flags given

    def load(sets: list[str]) -> JobSpec:
        sets = [*script_sets, *sets]
        spec = load_spec(
            config, sets, first.nodes, first.gpus, entry_args, backend.shares_filesystem, sections
        )
        if first.action in ("render", "submit") and not first.print_spec:
            # The entry point, found and compiled (never run) with the job's interpreter,
            # for every backend, before anything is rendered or queued.
            python = backend.entry_python(spec)
            if (spec.script, spec.module, python) not in checked:
                with contextlib.chdir(spec.workspace):
                    check_entry_point(spec, python)
                checked.add((spec.script, spec.module, python))
        backend.validate(spec)  # its [<name>] table's field checks, then its own rules
        return spec

    spec, members = None, []
    if first.sweeps and first.action not in ("render", "submit"):
        raise SpecError("--sweep goes with render or submit")
    if opts.watch and first.action != "status":
        raise SpecError(f"--watch goes with status (ddpkit status {first.backend} --watch)")
    if not 0 < opts.every < 86400:
        raise SpecError(f"--every {opts.every:g}: give the seconds between looks, e.g. 2")
    if first.sweeps:
        from ddpkit.tools.sweep import member_specs

        members = member_specs(load, first.sets, first.sweeps)
        spec = members[0]
    elif first.config or first.action in ("render", "submit") or first.print_spec:
        spec = load(first.sets)
    if first.print_spec:
        import tomli_w

        print(tomli_w.dumps(spec.to_dict()), end="")
        return 0
    opts.spec = spec
    if demo and first.action == "submit":
        print(
            "ddpkit: no ddpkit.toml here: running the kit's built-in demo job (an MLP on "
            f"synthetic data); `{shown or 'ddpkit submit ' + first.backend} train.py` runs "
            "your script, `ddpkit init` writes a job file for it",
            flush=True,  # stdout: stderr stays the one line of an error the submit may raise
        )
    if spec is None:
        return _act(backend, opts, spec, members)
    # Every backend acts from the workspace: the job's relative paths, its run dir and the
    # job records (.ddpkit/) all resolve there, whatever directory we started in.
    with contextlib.chdir(spec.workspace):
        return _act(backend, opts, spec, members)


def _act(backend: Any, opts: argparse.Namespace, spec: JobSpec | None, members: list) -> int:
    planned: dict[str, int] = {}
    if opts.plan and opts.action in ("render", "submit"):
        planned = check_plan(members or [spec])
    if opts.action == "submit" and spec is not None:
        from ddpkit.tools.backends import refuse_a_live_run_dir

        for member in members or [spec]:
            refuse_a_live_run_dir(member)
    if opts.action == "submit" and spec is not None and backend.shares_filesystem:
        # The job runs with this shell's environment on this host's network (local, SLURM):
        # its object store is asked here, before the queue (the save budget reads it too).
        from ddpkit.tools.backends.node_checks import check_object_store

        for member in {m.checkpoint_dir: m for m in members or [spec]}.values():
            check_object_store(member)
    if (opts.action == "submit" or opts.plan and opts.action == "render") and spec is not None:
        say_save_budget(backend, members or [spec], planned, opts.plan, opts.action)
    if (
        opts.action == "submit"
        and spec is not None
        and backend.shares_filesystem
        and backend.name != "local"
    ):
        # A queued job that will start from an earlier run's checkpoint (a local smoke test of
        # the same name) says so here, not after its wait in the queue.
        from ddpkit.tools.resume_notice import resume_line

        for member in members or [spec]:
            if line := resume_line(member):
                print(line, flush=True)
    if opts.action == "render":
        rc = 0
        for member in members or [spec]:
            text = backend.render(member)
            if members:
                print(f"==> sweep member {member.name} <==", file=sys.stderr)
            if not opts.quiet:
                print(text, end="")
            if opts.write:
                path = write_rendered(backend.name, member.name, backend.file_ext, text)
                print(f"wrote {path}", file=sys.stderr)
            rc = rc or backend.after_render(member, opts, text)
        return rc
    if opts.action == "submit":
        return backend.submit_sweep(members, opts) if members else backend.submit(spec, opts)
    if opts.action == "list":
        return backend.list_jobs(opts)
    if opts.action == "status" and opts.watch:
        from ddpkit.tools.watch import watch

        return watch(backend, opts.job, opts)
    return getattr(backend, opts.action)(opts.job, opts)


def check_plan(specs: list[JobSpec]) -> dict[str, int]:
    """`--plan`: the planner's dry run of each job (ddpkit.tools.planner.dryrun.plan_spec)
    before anything is rendered or queued; its refusal is one line (SpecError). Returns each
    planned job's checkpoint size in bytes, by job name (for the save budget)."""
    from ddpkit.tools.planner.dryrun import plan_spec

    sizes = {}
    for spec in specs:
        refusal, run = plan_spec(spec)
        if refusal:
            raise SpecError(f"--plan: job {spec.name!r} at {spec.world_size} ranks: {refusal}")
        print(f"--plan: job {spec.name!r} plans at {spec.world_size} ranks", file=sys.stderr)
        if run is not None:
            sizes[spec.name] = run.ckpt_bytes
    return sizes


def say_save_budget(
    backend: Any, specs: list[JobSpec], planned: dict[str, int], plan: bool, action: str
) -> None:
    """The save budget's two lines (tools/savebudget.py) for each job: with --plan on every
    backend, else on submit to a backend whose scheduler stops jobs within a window. On
    submit they go to stdout: stderr stays the one line of an error the backend's own checks
    may still raise (render's stdout is the rendered file, so there they go to stderr)."""
    from ddpkit.tools.savebudget import budget_lines

    out = sys.stdout if action == "submit" else sys.stderr

    for spec in specs:
        window = backend.stop_window(spec)
        if window is None and not plan:
            continue
        for line in budget_lines(spec, window, planned.get(spec.name)):
            print(line, file=out, flush=True)


def run_here(argv: list[str]) -> int:
    """`ddpkit run`: the job on this machine (submit local), with PNG charts of its metrics
    at the end when matplotlib is installed (the [plot] extra)."""
    own, _ = _split_entry_args(argv)
    if "-h" in own or "--help" in own:
        from ddpkit.tools.backends import load_backend

        p = build_parser(load_backend("local"), prog="ddpkit run")
        p.description = "Run the job on this machine through the node launcher (= submit local)."
        p.print_help()
        return 0
    return run(["submit", "local", "--plot", *argv], shown="ddpkit run")


def _script_sets(script: str, config: str | None) -> list[str]:
    """The --set assignments a positional SCRIPT stands for: it is the entry point (in place
    of the job file's); without a job file the job is named after it."""
    if not script.endswith(".py") and not Path(script).is_file():
        raise SpecError(
            f"{script!r} is not a Python script; give SCRIPT.py (e.g. `ddpkit run train.py "
            "-- --epochs 2`), or put your script's flags after `--`"
        )
    sets = [f"script={script}", "module=none"]
    if config is None and default_job_file() == BUILTIN_JOB:
        name = Path(script).stem.lower().replace("_", "-")
        if NAME_RE.match(name):
            sets.append(f"name={name}")
    return sets


def write_rendered(backend: str, name: str, ext: str, text: str) -> Path:
    from ddpkit.tools.backends import state_dir

    path = state_dir() / "rendered" / backend / f"{name}.{ext}"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # never a half-written file
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path


def main(argv: list[str] | None = None) -> int:
    from ddpkit.train.errors import run_cli

    return run_cli(lambda: run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
