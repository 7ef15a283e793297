"""Inspect a ddpkit checkpoint, or export its model to one file for inference.

    ddpkit ckpt inspect runs/default [--json]   # or .../checkpoints[/step-300]
    ddpkit ckpt export  runs/default/checkpoints/step-300 model.pt
    ddpkit ckpt export  runs/hf-run OUT_DIR --format hf      # an hf:DIR model
    ddpkit ckpt inspect s3://bucket/prefix                   # a checkpoint dir in a store

The export holds {"model": {name: tensor}, "meta": {...}} with full (unsharded) tensors and
loads with `torch.load(path, weights_only=True)`. `--format hf` (for a model trained as
`hf:DIR`) writes a directory that `AutoModelForCausalLM.from_pretrained(OUT)` loads
(safetensors, DIR's config and tokenizer; `--model-dir` if DIR has moved). An existing OUT,
or the OUT.tmp an interrupted export left, is refused unless `--force` replaces it. DCP's own
metadata is pickled: inspect and export only checkpoints from storage you trust.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddpkit.train.ckpt.files import METADATA
from ddpkit.train.ckpt.store import fetch, is_remote
from ddpkit.train.contract import CKPT_MARKER as MARKER
from ddpkit.train.contract import CKPT_STEP_PREFIX
from ddpkit.train.errors import CliParser, UserError, run_cli


def _step_dirs(d: Path) -> list[tuple[int, Path]]:
    """(step, path) of the step-N directories directly under d, oldest first."""
    out = []
    for q in d.glob(CKPT_STEP_PREFIX + "*"):
        n = q.name[len(CKPT_STEP_PREFIX) :]
        if q.is_dir() and n.isdigit():
            out.append((int(n), q))
    return sorted(out)


def _checkpoint_dir(path: str) -> Path:
    """A step-N dir as given; for a run dir or a checkpoints dir, its newest complete one."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(
            f"{path}: a file, not a checkpoint directory (a checkpoint is a DCP step-N "
            "directory; an export's .pt is read with torch.load); pass a run dir, its "
            "checkpoints dir or a step-N dir"
        )
    if not p.is_dir():
        raise UserError(
            f"{path}: no such directory; pass a run dir, its checkpoints dir or a step-N dir"
        )
    if (p / METADATA).is_file():
        return p
    steps = _step_dirs(p) or _step_dirs(p / "checkpoints")
    # The trainer's own definition of complete (a marker that parses, and .metadata).
    from ddpkit.train.ckpt import is_complete

    complete = [q for _, q in steps if is_complete(q)]
    if complete:
        _warn_newer_incomplete(steps, complete[-1])
        return complete[-1]
    if steps:
        raise UserError(
            f"{path}: no complete checkpoint ({', '.join(q.name for _, q in steps[-3:])} lack "
            f"{MARKER}: a save was cut short); pass a step-N dir to read one anyway"
        )
    raise UserError(
        f"{path}: not a DCP checkpoint and no {CKPT_STEP_PREFIX}N checkpoints under it "
        "(or under checkpoints/); pass a run dir, its checkpoints dir or a step-N dir"
    )


def _warn_newer_incomplete(steps: list[tuple[int, Path]], chosen: Path) -> None:
    """One warning line per newer step dir whose marker is there but damaged, as a resume
    says it: such a checkpoint is not passed over in silence. (One without a marker is a
    save still running, or cut short: the usual sight beside a live run, not worth a line.)"""
    from ddpkit.train.ckpt.layout import why_incomplete

    newest = next(n for n, q in steps if q == chosen)
    for n, q in steps:
        if n > newest and (q / MARKER).exists():
            print(
                f"warning: skipping incomplete checkpoint {q} ({why_incomplete(q)})",
                file=sys.stderr,
            )


def _dtype_size(dtype: Any) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def inspect(path: Path) -> dict[str, Any]:
    from ddpkit.train.ckpt.layout import marker
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    info, problem = marker(path)  # a bad marker is shown as such, its fields as unknown
    entries = []
    for key in sorted(meta):
        m = meta[key]
        if isinstance(m, TensorStorageMetadata):
            shape = list(m.size)
            dtype = m.properties.dtype
            nbytes = math.prod(shape) * _dtype_size(dtype)
            entries.append(
                {
                    "key": key,
                    "shape": shape,
                    "dtype": str(dtype).replace("torch.", ""),
                    "bytes": nbytes,
                }
            )
        else:
            entries.append({"key": key, "shape": None, "dtype": "object", "bytes": None})
    from ddpkit.train.ckpt.files import verify_files

    if info is None:
        info, checksums = {}, f"not checked ({problem})"
    else:  # what a resume would find: "ok", what is wrong, or none recorded (an older save)
        checksums = (verify_files(path, info) or "ok") if "files" in info else "none recorded"
    return {
        "path": str(path),
        "complete": problem is None,
        "marker": problem or "ok",
        "checksums": checksums,
        "step": info.get("step"),
        "world_size": info.get("world_size"),
        "parallel": info.get("parallel"),
        "sharding": info.get("sharding"),
        "model": info.get("model"),
        "tensor_bytes": sum(e["bytes"] or 0 for e in entries),
        "model_bytes": sum(e["bytes"] or 0 for e in entries if e["key"].startswith("model.")),
        "entries": entries,
    }


def verified(path: Path) -> None:
    """Refuse a checkpoint whose files fail their recorded checksums, the check a resume
    makes (ddpkit.train.ckpt.verify): every reader of a checkpoint trusts it alike."""
    from ddpkit.train.ckpt import verify

    if "files" not in _marker(path):
        return  # a checkpoint from before the checksums (or a bare DCP dir): nothing to check
    problem = verify(path)
    if problem is not None:
        raise UserError(
            f"{path}: fails its checksums ({problem}); export an older step-N dir (a resume "
            "would skip this one too)"
        )


def load_full_model(path: Path, part: str = "model") -> dict[str, Any]:
    """Full tensors of one part ("model", "optim", "train") of a DCP checkpoint, in one
    process (no process group), after its checksums verify."""
    verified(path)
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(str(path)),
        planner=_EmptyStateDictLoadPlanner(keys={part}),
        no_dist=True,
    )
    return state[part]


def _files(path: Path) -> set[str]:
    try:
        return set(os.listdir(path))
    except OSError:
        return set()


@contextlib.contextmanager
def read_while_pruned(path: Path, files: set[str], tool: str) -> Iterator[None]:
    """The run that wrote `path` may prune it (--ckpt-keep) while a tool reads it, between
    choosing the step dir (`files`: its names then) and the last byte read. A read that fails
    after some of those files went away is one line; one that fails with every file still in
    place is a real failure and keeps its traceback."""

    def whole() -> bool:
        return METADATA in files and files <= _files(path)

    gone = UserError(
        f"{path}: deleted while {tool} read it (pruned by its run's --ckpt-keep?)"
        + ("; nothing was written" if tool == "export" else "")
        + "; pass the run dir for its newest complete checkpoint, or a newer step-N dir"
    )
    if not whole():  # already going: DCP would log a traceback per metadata file it misses
        raise gone
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # DCP's CheckpointException is a BaseException
        if whole():
            raise
        raise gone from None


def _marker(path: Path) -> dict[str, Any]:
    """The step dir's marker, {} where there is none (a bare DCP dir); one that is there but
    unreadable or of another shape is refused, as a resume skips it."""
    from ddpkit.train.ckpt.layout import marker

    info, problem = marker(path)
    if info is None and (path / MARKER).exists():
        raise UserError(
            f"{path}: {problem}; export an older step-N dir (a resume would skip this one too)"
        )
    return info or {}


def model_tensors(path: Path) -> dict[str, Any]:
    """The full model tensors of a step dir, contiguous (what an export writes)."""
    import torch

    state = load_full_model(path)
    return {k: v.detach().contiguous() for k, v in state.items() if isinstance(v, torch.Tensor)}


def export(model: dict[str, Any], info: dict[str, Any], out: Path) -> dict[str, Any]:
    import torch

    meta = {
        k: info[k] for k in ("step", "world_size", "parallel", "sharding", "model") if k in info
    }
    meta = {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in meta.items()}
    tmp = _tmp_path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model, "meta": meta}, tmp)
        os.replace(tmp, out)  # never a half-written export under the final name
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(
            f"export: cannot write {out} ({e.strerror or e}); pass a path in a writable "
            "directory with room for the model"
        ) from None
    return {
        "out": str(out),
        "tensors": len(model),
        "bytes": sum(t.numel() * t.element_size() for t in model.values()),
        **meta,
    }


def hf_model_dir(path: Path, info: dict[str, Any], model_dir: str | None) -> tuple[str, str]:
    """(the model's name in the marker, its hf: directory), checked before the export reads."""
    model = info.get("model") or ""
    if not isinstance(model, str):
        model = str(model)
    if model_dir is None:
        if not model.startswith("hf:"):
            raise UserError(
                f"{path}: model {model or '?'} was not trained as hf:DIR; --format hf exports "
                "Hugging Face models only (use the default --format pt, or pass --model-dir)"
            )
        model_dir = model[3:]
    if not (Path(model_dir) / "config.json").is_file():
        raise UserError(
            f"--model-dir {model_dir}: no config.json there; pass the hf: directory the run "
            "was trained with"
        )
    return model, model_dir


def export_hf(state: dict[str, Any], model: str, model_dir: str, out: Path) -> dict[str, Any]:
    from ddpkit.train import hf

    return {**hf.export(state, Path(model_dir), out), "model": model}


def _tmp_path(out: Path) -> Path:
    return out.with_name(out.name + ".tmp")


def check_export_target(out: Path, fmt: str, force: bool) -> None:
    """Refuse, before anything is read or written, an output that would replace what is
    there: an existing file or directory, or the <out>.tmp an interrupted export left (it may
    be the only copy of something). --force replaces them; a directory never becomes the
    single file of --format pt, nor a file the directory of --format hf."""
    tmp = _tmp_path(out)
    want = "a file" if fmt == "pt" else "a directory"
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise UserError(f"export: {out} is under {parent}, a file; pass another output path")
    if out.exists() or out.is_symlink():
        kind = "directory" if out.is_dir() else "file"
        if (kind == "directory") != (fmt == "hf"):
            raise UserError(
                f"export: {out} is an existing {kind}, and --format {fmt} writes {want}; "
                "pass another output path"
            )
        if not force:
            raise UserError(
                f"export: {out} already exists; pass another output path, or --force to replace it"
            )
    if (tmp.exists() or tmp.is_symlink()) and not force:
        raise UserError(
            f"export: {tmp} exists (left by an interrupted export?); remove it, or pass "
            "--force to overwrite it"
        )
    if force and tmp.is_dir() and not tmp.is_symlink():
        import shutil

        shutil.rmtree(tmp)
    elif force and (tmp.exists() or tmp.is_symlink()):
        tmp.unlink()


def _print_inspect(r: dict[str, Any]) -> None:
    print(
        f"{r['path']}: step {r['step']}, written by {r['world_size']} ranks "
        f"({r['parallel']}{'/' + r['sharding'] if r['sharding'] else ''}), model {r['model']}, "
        f"{'complete' if r['complete'] else 'INCOMPLETE (' + r['marker'] + ')'}"
    )
    print(f"tensors: {r['tensor_bytes'] / 2**20:.2f} MiB, model {r['model_bytes'] / 2**20:.2f} MiB")
    print(f"checksums: {r['checksums']}")
    for e in r["entries"]:
        shape = "x".join(map(str, e["shape"])) if e["shape"] is not None else "-"
        size = f"{e['bytes']:>12,}" if e["bytes"] is not None else f"{'-':>12}"
        print(f"  {e['key']:<50} {shape:<16} {e['dtype']:<9} {size}")


def main(argv: list[str] | None = None) -> int:
    return run_cli(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    ap = CliParser(
        prog="ddpkit ckpt",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    pi = sub.add_parser("inspect", help="step, world size, keys, shapes, dtypes, bytes")
    pi.add_argument("dir", help="a step-N dir, or a run/checkpoints dir (its newest complete)")
    pi.add_argument("--json", action="store_true")
    pe = sub.add_parser("export", help="one consolidated file (torch.load weights_only=True)")
    pe.add_argument("dir")
    pe.add_argument("out")
    pe.add_argument("--json", action="store_true")
    pe.add_argument(
        "--format",
        choices=["pt", "hf"],
        default="pt",
        help="pt: one torch file; hf: a from_pretrained directory (safetensors)",
    )
    pe.add_argument("--model-dir", help="--format hf: the model's hf: directory (its config)")
    pe.add_argument(
        "--force",
        action="store_true",
        help="replace an existing OUT (and a leftover OUT.tmp); without it, both are refused",
    )
    args = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        where, shown = args.dir, None
        if is_remote(where):  # a store's checkpoint: a local copy (verified as it is read)
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ddpkit-ckpt-"))
            copy, shown = fetch(where, Path(tmp))
            where = str(copy)
        return _run(args, where, shown)


def _run(args: argparse.Namespace, where: str, shown: str | None) -> int:
    path = _checkpoint_dir(where)
    files = _files(path)
    if args.cmd == "inspect":
        with read_while_pruned(path, files, "inspect"):
            r = inspect(path)
        r["path"] = shown or r["path"]
        print(json.dumps(r, indent=2)) if args.json else _print_inspect(r)
    else:
        out = Path(args.out)
        check_export_target(out, args.format, args.force)
        with read_while_pruned(path, files, "export"):
            info = _marker(path)
            if args.format == "hf":
                name, model_dir = hf_model_dir(path, info, args.model_dir)
            model = model_tensors(path)
        if args.format == "hf":
            r = export_hf(model, name, model_dir, out)
        else:
            r = export(model, info, out)
        print(
            json.dumps(r)
            if args.json
            else f"wrote {r['out']}: {r['tensors']} tensors, {r['bytes'] / 2**20:.2f} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
