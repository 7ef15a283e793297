"""One CLI for every backend:

    python -m tools.launch {render,submit,status,logs,cancel} {slurm,k8s,docker} [JOB]
        [--config FILE] [--set key=value ...] [--nodes N] [--gpus N] [--write] [--wait]
        [--print-spec] [-- extra train flags]

render prints exactly what submit sends; --write also saves it under out/<backend>/.
Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tomli_w

from tools.backends import BACKENDS, OUT_DIR, load_backend
from tools.spec import SpecError, load_spec

ACTIONS = ("render", "submit", "status", "logs", "cancel")
EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        raise SpecError(f"{message} (see python -m tools.launch --help)")


def build_parser(backend_module: object | None = None) -> argparse.ArgumentParser:
    p = _Parser(prog="python -m tools.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("backend", choices=tuple(BACKENDS))
    p.add_argument("job", nargs="?", help="status/logs/cancel: job id (default: the last one)")
    p.add_argument("--config", help="job file (TOML), e.g. configs/default.toml")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a dotted key of the job file, e.g. slurm.partition=gpu, train.lr=3e-4",
    )
    p.add_argument("--nodes", type=int, help="number of nodes")
    p.add_argument("--gpus", type=int, help="processes per node (one per GPU)")
    p.add_argument("--write", action="store_true", help="render: also write out/<backend>/")
    p.add_argument("--wait", action="store_true", help="submit: follow the job to its end")
    p.add_argument("--print-spec", action="store_true", help="print the resolved spec, exit")
    add = getattr(backend_module, "add_arguments", None)
    if add is not None:
        add(p)
    return p


def _split_train_args(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def run(argv: list[str]) -> int:
    argv, train_args = _split_train_args(argv)
    # The first pass reads the common flags (backend flags stay unknown), so the spec is
    # checked before the backend module (and submitit or kubernetes) is imported.
    first, _ = build_parser().parse_known_args(argv)
    spec = None
    if first.config or first.action in ("render", "submit") or first.print_spec:
        spec = load_spec(
            first.config or "configs/default.toml", first.sets, first.nodes, first.gpus, train_args
        )
    if first.print_spec:
        print(tomli_w.dumps(spec.to_dict()), end="")
        return 0
    backend = load_backend(first.backend)
    opts = build_parser(backend).parse_args(argv)
    opts.spec = spec
    if opts.action == "render":
        text = backend.render(opts.spec)
        print(text, end="")
        if opts.write:
            path = write_rendered(first.backend, opts.spec.name, backend.FILE_EXT, text)
            print(f"wrote {path}", file=sys.stderr)
        after = getattr(backend, "after_render", None)
        return after(opts.spec, opts, text) if after else 0
    if opts.action == "submit":
        return backend.submit(opts.spec, opts)
    return getattr(backend, opts.action)(opts.job, opts)


def write_rendered(backend: str, name: str, ext: str, text: str) -> Path:
    path = OUT_DIR / backend / f"{name}.{ext}"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # never a half-written file
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path


def main(argv: list[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
