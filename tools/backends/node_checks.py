"""The checks a job gets before it is queued, with the Python its nodes will run: the entry
point found and compiled (never executed: a module's top-level code does not run in the
submitting process) and the training module's import paths imported in a fresh interpreter,
a pass remembered until the import path changes. One line each (SpecError), exit 2.
Used by `submit` (tools/submit.py), the local backend and the SLURM engine."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddpkit.tools.backends import state_dir
from ddpkit.tools.backends.ft_entry import check_torchft_entry
from ddpkit.tools.jobspec import JobSpec, SpecError
from ddpkit.tools.templating import check_passable
from ddpkit.train.contract import is_remote
from ddpkit.train.errors import UserError

# Run by the nodes' Python: import each "module[:attribute]" given, stop at the first that
# fails and print it as JSON. Only modules are imported, never a script (that would run it).
_IMPORT_CHECK = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    mod, _, attr = name.partition(":")
    try:
        m = importlib.import_module(mod)
        if attr:
            getattr(m, attr)
    except BaseException as e:
        print(json.dumps([name, f"{type(e).__name__}: {e}".splitlines()[0]]))
        sys.exit(1)
"""


# Compiles a file as `python FILE` would, never running it: the problem as [kind, detail], or
# None. One text for both places it runs: in this process when the job's Python is this one
# (a script needs no other interpreter to compile: saves a Python start, ~0.1 CPU-s, on every
# `ddpkit run`), else inside _ENTRY_CHECK in the job's Python.
_COMPILE = r"""
import os

def compile_problem(path):
    try:
        with open(path, "rb") as f:
            compile(f.read(), path, "exec", dont_inherit=True)
    except SyntaxError as e:
        where = os.path.relpath(e.filename or path)
        return ["syntax", f"{where}:{e.lineno}: {type(e).__name__}: {e.msg}"]
    except (OSError, ValueError) as e:
        return ["syntax", f"{os.path.relpath(path)}: {e}"]
    return None
"""

# Run by the job's Python: find the entry point as `python SCRIPT` / `python -m MODULE` will
# and compile it, never executing or importing it (a module's parent packages are located
# through the import finders, not imported). Prints [kind, detail] and exits 1 on a problem.
_ENTRY_CHECK = (
    _COMPILE
    + r"""
import json, sys
kind, name = json.loads(sys.argv[1])

def find(name):
    spec, where = None, None
    parts = name.split(".")
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        if i and where is None:
            return None, f"{parts[i - 1]} is a module, not a package"
        for finder in sys.meta_path:
            spec = finder.find_spec(full, where) if hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None, f"no module named {full!r}"
        where = spec.submodule_search_locations
    if where is not None:  # a package: `python -m` runs its __main__
        spec, _ = find(name + ".__main__")
        if spec is None:
            return None, f"{name} is a package without a __main__.py"
    return spec, None

if kind == "script":
    path = name
else:
    spec, problem = find(name)
    if problem:
        print(json.dumps(["missing", problem]))
        sys.exit(1)
    path = spec.origin if spec.origin and spec.origin.endswith(".py") else None
problem = None if path is None else compile_problem(path)
if problem:
    print(json.dumps(problem))
    sys.exit(1)
print(json.dumps(["found", path]))
"""
)


def _compile_here(path: str) -> list[str] | None:
    """_COMPILE's compile_problem, run in this process."""
    scope: dict[str, Any] = {}
    exec(_COMPILE, scope)  # noqa: S102  (the kit's own text above, never input)
    return scope["compile_problem"](path)


def _check_env(spec: JobSpec) -> dict[str, str]:
    """The environment the submit-time checks run the job's Python in: this one, the job's
    own, and the workspace (the current directory) first on PYTHONPATH, as on the nodes."""
    paths = [str(Path.cwd()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    job_env = spec.launch_env()
    for value in (*job_env, *job_env.values()):
        check_passable(value)  # a NUL reaches no process: the render's one line, said first
    return {**os.environ, **job_env, "PYTHONPATH": os.pathsep.join(paths)}


def check_entry_point(spec: JobSpec, python: str) -> None:
    """The job's own entry point (`script =` or `module =`), for every backend before anything
    is rendered or queued: the file exists in the workspace (the current directory), it is
    found and compiles with `python` (the job's interpreter; this one when that is not on this
    machine). Never executed or imported: a module with top-level code is not run here.
    One line (SpecError) naming the file and line of a syntax error. Under torchft, the entry
    must take part in it (ft_entry.check_torchft_entry)."""
    if spec.default_entry:
        return
    kind, name = ("script", spec.script) if spec.script else ("module", spec.module)
    if kind == "script" and not Path(str(name)).is_file():
        raise SpecError(
            f"script {name!r} is not a file in the workspace {Path.cwd()}; fix the path "
            "(relative to the job file's directory)"
        )
    exe = shutil.which(python) if "/" not in python else python
    if not exe or not os.access(exe, os.X_OK) or os.path.isdir(exe):
        exe = sys.executable  # the nodes' Python is not here (render): compile with this one
    env = _check_env(spec)
    if kind == "script" and os.path.abspath(exe) == os.path.abspath(sys.executable):
        # The job's Python is this one: it compiles the same way here, no second Python. (A
        # module is still found by the job's Python, with the job's import path.)
        found = _compile_here(str(name))
        if found is None:
            return check_torchft_entry(spec, kind, str(name), str(name))
        problem, detail = found
    else:
        r = subprocess.run(
            [exe, "-c", _ENTRY_CHECK, json.dumps([kind, name])],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        try:
            problem, detail = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            if r.returncode == 0:  # found, where not said: a script is its own file
                return check_torchft_entry(
                    spec, kind, str(name), name if kind == "script" else None
                )
            tail = (r.stderr.strip().splitlines() or ["?"])[-1]
            raise SpecError(f"{exe} does not start: {tail}") from None
        if r.returncode == 0:  # ["found", its file (None: not a .py)]
            return check_torchft_entry(spec, kind, str(name), detail)
    if problem == "syntax":
        raise SpecError(f"{detail} (the {kind} {name!r} does not compile with {exe}); fix it")
    raise SpecError(
        f"module {name!r} is not found by {exe} in {Path.cwd()} ({detail}); fix the name "
        "(what `python -m` takes) or install its package for that Python"
    )


# How long submit waits for the object store's answer: a store this host cannot reach (an
# endpoint only the nodes' network sees) is the nodes' to check when the job starts.
STORE_PROBE_S = 20.0
# S3 error codes that refuse the credentials, beyond those s3fs itself turns into a
# PermissionError (versitygw answers an unknown access key with XAdminUserNotFound).
REFUSED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "XAdminUserNotFound", "ExpiredToken",
           "InvalidToken")  # fmt: skip


def check_object_store(spec: JobSpec) -> None:
    """Before the queue: the job's checkpoint dir in an object store (ckpt_dir = "s3://...")
    is listed from this host with the job's credentials (this shell's environment, the job's
    env table over it: what the nodes get) through the trainer's own store
    (train/ckpt/store.py). Refused credentials or no such bucket: one line (SpecError)
    naming the store, never a credential. No answer from here: a note, the job goes on."""
    url = spec.checkpoint_dir
    if not is_remote(url):
        return
    from ddpkit.train.ckpt.store import describe, open_store, unreachable

    job_env = {k: v for k, v in spec.env.items() if k.startswith("AWS_")}
    answer: dict[str, BaseException | None] = {}
    with _environ(job_env):
        try:
            store = open_store(url)
        except UserError:
            return  # no s3fs here: the nodes' own check names what to install
        # A thread: a listing that hangs (a network that drops packets) must not hold the submit.
        probe = threading.Thread(target=_list_store, args=(store, answer), daemon=True)
        probe.start()
        probe.join(STORE_PROBE_S)
    error = answer.get("error")
    if "error" not in answer or (error is not None and unreachable(error) is not None):
        why = "no answer" if error is None else describe(error)
        print(f"ddpkit: {url}: the object store does not answer from this host ({why}); the "
              "nodes check it when the job starts", flush=True)  # fmt: skip
        return
    if error is not None:
        if not isinstance(error, PermissionError) and any(c in str(error) for c in REFUSED):
            error = PermissionError(str(error))  # said as refused credentials, not a lost server
        raise SpecError(f"{store.problem(error, 'ckpt_dir ', 'read')} (checked before the queue)")


def _list_store(store: Any, answer: dict[str, BaseException | None]) -> None:
    try:
        store.steps()
        answer["error"] = None
    except Exception as e:  # said by check_object_store
        answer["error"] = e


@contextlib.contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    """os.environ with `extra` over it (S3 clients read their settings from it), restored."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def node_imports(spec: JobSpec) -> list[tuple[str, str]]:
    """(what, module[:attribute]) the nodes must import: torch, the kit's node launcher and
    the [train] import paths (model, dataset, loss). The entry point is never imported here
    (check_entry_point finds and compiles it: importing would run a script's top level)."""
    wanted = [("torch", "torch"), ("ddpkit", "ddpkit.train.node")]
    for key in ("model", "dataset", "loss"):
        value = spec.train.get(key)
        if isinstance(value, str) and ":" in value and not value.startswith("hf:"):
            wanted.append((f"train.{key}", value))
    return wanted


def check_node_env(spec: JobSpec, python: str, key: str) -> None:
    """Before anything is queued: the nodes' Python exists, and torch, ddpkit, the entry point
    and every import path import with it, in the workspace, with the job's environment (what
    the nodes will have on a shared filesystem). One line each (SpecError)."""
    exe = shutil.which(python) if "/" not in python else python
    if not exe or not os.access(exe, os.X_OK) or os.path.isdir(exe):
        raise SpecError(
            f"{key} {python!r} is not an executable Python on this machine (the nodes run the "
            f"job with it); set {key} to the interpreter that has torch and ddpkit"
        )
    wanted = node_imports(spec)
    env = _check_env(spec)
    passed = _passed_mark(exe, env, wanted)
    if passed is not None and passed.is_file():
        return  # the same imports passed with nothing they depend on changed since
    r = subprocess.run(
        [exe, "-c", _IMPORT_CHECK, json.dumps([name for _, name in wanted])],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if r.returncode == 0:
        if passed is not None:
            with contextlib.suppress(OSError):  # a cache: an unwritable one only costs time
                passed.parent.mkdir(parents=True, exist_ok=True)
                passed.touch()
        return
    try:
        name, error = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise SpecError(f"{key} {python} does not start: {tail}") from None
    what = dict((n, w) for w, n in wanted)[name]
    raise SpecError(
        f"{what} {name!r} does not import with {exe} in {Path.cwd()} ({error}); install it "
        f"for that Python, fix the path, or point {key} at the nodes' interpreter"
    )


# Environment variables that can change whether torch imports (its libraries, the import path).
_IMPORT_ENV = ("PATH", "PYTHON", "LD_", "CUDA", "TORCH", "NCCL", "VIRTUAL_ENV", "CONDA")


def _passed_mark(exe: str, env: dict[str, str], wanted: list[tuple[str, str]]) -> Path | None:
    """Where a passed check_node_env is remembered (.ddpkit/checked/<fingerprint>), or None
    when it is not: importing torch in a fresh Python costs 1-2 CPU-seconds (10 s of wall time
    on a loaded login node) on every submit. Only for this very interpreter (its import path
    is known here) and torch + the node launcher alone (a user's import paths are the user's
    files, checked every time). The fingerprint: the interpreter, what on its import path and
    PYTHONPATH bears an imported package's name or is a .pth (with its mtime: an install or
    removal changes it), torch's and the launcher's files, the working directory and the
    variables of _IMPORT_ENV."""
    if len(wanted) > 2 or os.path.abspath(exe) != os.path.abspath(sys.executable):
        return None
    tops = {name.split(".")[0] for _, name in wanted}

    def named(d: str) -> list[str]:
        """What in d bears the name of an imported package (torch/, torch.py, torch-*.dist-info
        added, replaced or removed) or may point elsewhere (a .pth): not every file written
        there (the workspace is on the path, and other work writes into it)."""
        return [
            f"{d}/{e} {os.stat(os.path.join(d, e)).st_mtime_ns}"
            for e in sorted(os.listdir(d))
            if e.split(".")[0].split("-")[0] in tops or e.endswith(".pth")
        ]

    try:
        parts = [exe, str(os.stat(exe).st_mtime_ns), str(Path.cwd()), json.dumps(wanted)]
        for d in [*sys.path, *env.get("PYTHONPATH", "").split(os.pathsep)]:
            if d and os.path.isdir(d):
                parts.append(d)
                parts += named(d)
        for _, name in wanted:
            found = importlib.util.find_spec(name.partition(":")[0])  # no import: a look-up
            origin = found.origin if found is not None else None
            parts.append(f"{origin} {os.stat(origin).st_mtime_ns if origin else None}")
    except (OSError, ImportError, ValueError):
        return None
    parts += sorted(f"{k}={v}" for k, v in env.items() if k.startswith(_IMPORT_ENV))
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
    return state_dir() / "checked" / digest
