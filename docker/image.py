"""The kit's image: the engine to use, the staged build context, `docker build`."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from ddpkit.docker.render import DOCKERFILE
from ddpkit.tools.backends import user_image
from ddpkit.tools.jobspec import JobSpec, SpecError
from ddpkit.tools.templating import KIT_DIR, shell_quote


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--build", action="store_true", help="render: also build the image")
    p.add_argument("--base-image", help="build: BASE_IMAGE build argument (FROM)")
    p.add_argument(
        "--engine", choices=("docker", "podman"), help="default: docker if its engine answers"
    )
    if "--follow" not in p._option_string_actions:  # the launcher may define it for all
        p.add_argument("-f", "--follow", action="store_true", help="logs: stream to the end")


def find_engine(preferred: str | None = None) -> str:
    """docker when its engine answers, else podman; SpecError when neither is usable."""
    if preferred:
        if not shutil.which(preferred):
            raise SpecError(f"--engine {preferred}: not installed; install it or drop --engine")
        return preferred
    if shutil.which("docker"):
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=60)
        if info.returncode == 0:
            return "docker"
    if shutil.which("podman"):
        return "podman"
    raise SpecError(
        "no container engine: install Docker (and start its daemon) or podman, or pass --engine"
    )


def _git(*args: str) -> str:
    """git in the kit's checkout; "" for an installed kit (its site-packages may sit inside
    the user's own repository, whose revision is not the kit's)."""
    if not (KIT_DIR / "pyproject.toml").is_file():
        return ""
    r = subprocess.run(["git", *args], cwd=KIT_DIR, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def build_argv(
    engine: str,
    image: str,
    base_image: str | None,
    revision: str,
    source: str,
    uid: int,
    gid: int,
    version: str = "",
    context: Path = Path("."),
) -> list[str]:
    """`docker build` for the ddpkit image from a staged context (stage_kit_context)."""
    args = {"REVISION": revision or "unknown", "SOURCE": source or "unknown"}
    if version:
        args["VERSION"] = version
    if base_image:
        args["BASE_IMAGE"] = base_image
    # The container user gets the builder's ids, so bind-mounted run dirs are writable by
    # both; a root builder gets the non-root default instead.
    if uid != 0:
        args.update(UID=str(uid), GID=str(gid))
    argv = [engine, "build", "-f", str(context / DOCKERFILE), "-t", image]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    return argv + [str(context)]


def kit_sources() -> tuple[list[str], list[str]]:
    """What the wheel is built from, as paths in the kit: (pyproject.toml and the files it
    names, the package dirs its package-dir maps). Read from pyproject.toml, so a new package
    needs no change here."""
    project = tomllib.loads((KIT_DIR / "pyproject.toml").read_text())
    meta, tool = project["project"], project["tool"]["setuptools"]
    readme = meta.get("readme", "")
    readme = readme.get("file", "") if isinstance(readme, dict) else readme
    files = ["pyproject.toml", readme, *meta.get("license-files", [])]
    return list(filter(None, files)), sorted(set(tool["package-dir"].values()))


def copy_kit_sources(dest: Path) -> None:
    """Copy the wheel's sources (kit_sources) to dest."""
    files, folders = kit_sources()
    for name in files:
        shutil.copy2(KIT_DIR / name, dest / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in folders:
        shutil.copytree(KIT_DIR / folder, dest / folder, ignore=skip)


def kit_revision() -> str:
    """The image's REVISION label: the checkout's commit, with "-dirty" when a file the image
    is built from (kit_sources: the wheel's, the Dockerfile and the configs among them) has
    uncommitted edits; "" for an installed kit."""
    revision = _git("rev-parse", "HEAD")
    if revision and _git("status", "--porcelain", "--", *(p for ps in kit_sources() for p in ps)):
        revision += "-dirty"
    return revision


def kit_wheel(dest: Path) -> Path:
    """The ddpkit wheel the image installs: built from the checkout (a development install),
    else the installed distribution's own files packed again (a wheel's RECORD lists them)."""
    dest.mkdir(parents=True, exist_ok=True)
    if (KIT_DIR / "pyproject.toml").is_file():
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        with tempfile.TemporaryDirectory(prefix="ddpkit-src-") as src:
            # setuptools writes build/ and *.egg-info beside the sources it builds: it builds
            # a copy, so nothing is written into the kit's checkout.
            copy_kit_sources(Path(src))
            r = subprocess.run([*cmd, "-w", str(dest), src], capture_output=True, text=True)
        if r.returncode:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
            raise SpecError(f"building the ddpkit wheel failed: {tail[0]}")
        return next(dest.glob("ddpkit-*.whl"))
    import importlib.metadata
    import zipfile

    dist = importlib.metadata.distribution("ddpkit")
    tag = "py3-none-any"
    wheel = dest / f"ddpkit-{dist.version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in dist.files or []:
            if f.suffix == ".pyc" or str(f).startswith(".."):
                continue  # caches, and the console script installed outside site-packages
            zf.write(f.locate(), str(f))
    return wheel


# The extras the nodes need beside torch: s3 (fsspec + s3fs) for ckpt_dir = "s3://...", ft
# (torchft) for fault_tolerance = "torchft".
NODE_EXTRAS = ("s3", "ft")
# The kit's own dependencies the nodes import beyond the base image (the kit's wheel goes in
# with --no-deps): prometheus-client, for every run's metrics.prom and its metrics endpoint.
NODE_DEPS = ("prometheus-client",)
# What the base image brings (Dockerfile: torch >= 2.9 checked): never staged, never
# reinstalled (stage_wheels).
BASE_HAS = frozenset({"torch", "numpy"})
NODE_REQUIREMENTS = "docker/node-requirements.txt"  # staged; the Dockerfile installs it
NODE_REQUIREMENTS_NO_DEPS = "docker/node-requirements-nodeps.txt"  # those on the base's torch
NODE_WHEELS = "node-wheels"  # staged wheels of NODE_REQUIREMENTS (best effort)


def node_requirements() -> list[str]:
    """The requirements of NODE_EXTRAS, from the one place they are declared: pyproject.toml
    in a checkout, the installed distribution's metadata otherwise."""
    if (KIT_DIR / "pyproject.toml").is_file():
        extras = tomllib.loads((KIT_DIR / "pyproject.toml").read_text())["project"]
        own = [r for r in extras["dependencies"] if _name(r) in NODE_DEPS]
        return [r for e in NODE_EXTRAS for r in extras["optional-dependencies"][e]] + own
    import importlib.metadata
    import re

    out = []
    for req in importlib.metadata.requires("ddpkit") or []:
        spec, _, marker = req.partition(";")
        got = re.search(r"extra\s*==\s*[\"']([^\"']+)", marker)
        if (got and got.group(1) in NODE_EXTRAS) or (not got and _name(spec) in NODE_DEPS):
            out.append(spec.strip())
    return out


def _name(req: str) -> str:
    import re

    return re.split(r"[\s\[<>=!~;(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _wheel_requires(wheel: Path) -> list[str]:
    """A wheel's own dependencies (its METADATA's Requires-Dist, less those of its extras)."""
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    reqs = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]
    return [r for r in reqs if "extra ==" not in r]


def stage_wheels(dest: Path, reqs: list[str]) -> tuple[list[str], list[str]]:
    """Best effort: the wheels of `reqs` for this machine's Python, so the build installs
    them without an index. Returns (installed with their dependencies, installed without):
    a requirement on the base image's packages (torchft on torch) is installed without its
    dependencies, and those of its own beyond the base image join the first list: pip would
    otherwise resolve torch's own dependencies again, and staging them would pull a 1-3 GB
    torch wheel. A requirement pip cannot get here stays in the first list."""
    pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(dest)]
    plain: list[str] = []
    bare: list[str] = []
    for req in reqs:
        got = set(dest.glob("*.whl"))
        subprocess.run([*pip, "--no-deps", req], capture_output=True, timeout=600)
        wheel = next(iter(set(dest.glob("*.whl")) - got), None)
        deps = _wheel_requires(wheel) if wheel is not None else []
        if any(_name(d) in BASE_HAS for d in deps):
            bare.append(req)
            plain.extend(d for d in deps if _name(d) not in BASE_HAS)
        else:
            plain.append(req)
    if plain:
        subprocess.run([*pip, *plain], capture_output=True, timeout=600)
    return plain, bare


def stage_kit_context(ctx: Path) -> None:
    """The ddpkit image's build context: its Dockerfile and entrypoint, the example job
    files, the node requirements and the ddpkit wheel (nothing else of the checkout or the
    workspace)."""
    (ctx / "docker").mkdir(parents=True)
    # Their wheels for this machine's Python, when its pip can get them: a build with no
    # index inside (a proxy, a CA bundle only the host has) installs these; an image whose
    # Python differs falls back to the index.
    (ctx / NODE_WHEELS).mkdir()
    plain, bare = stage_wheels(ctx / NODE_WHEELS, node_requirements())
    (ctx / NODE_REQUIREMENTS).write_text("".join(f"{r}\n" for r in plain))
    (ctx / NODE_REQUIREMENTS_NO_DEPS).write_text("".join(f"{r}\n" for r in bare))
    for name in ("Dockerfile", "entrypoint.sh"):
        shutil.copyfile(KIT_DIR / "docker" / name, ctx / "docker" / name)
    # Executable whatever mode the installed copy kept (a wheel's data files need not).
    (ctx / "docker" / "entrypoint.sh").chmod(0o755)
    shutil.copytree(KIT_DIR / "configs", ctx / "configs", ignore=shutil.ignore_patterns("*.py*"))
    kit_wheel(ctx / "wheels")


def build(spec: JobSpec, opts: argparse.Namespace) -> int:
    """Build the ddpkit image; when the job has code of its own (user_image.wanted), then
    the workspace's image FROM it (user_image.py)."""
    user = user_image.wanted(spec)
    if user:
        user_image.check_files(spec)  # before minutes of building
    engine = find_engine(getattr(opts, "engine", None))
    revision = kit_revision()
    from ddpkit import __version__

    with tempfile.TemporaryDirectory(prefix="ddpkit-kit-") as kit_ctx:
        stage_kit_context(Path(kit_ctx))
        argv = build_argv(
            engine,
            spec.docker.kit_image if user else spec.image,
            getattr(opts, "base_image", None),
            revision,
            _git("remote", "get-url", "origin"),
            os.getuid(),
            os.getgid(),
            __version__,
            context=Path(kit_ctx),
        )
        print("+ " + " ".join(shell_quote(a) for a in argv), file=sys.stderr)
        rc = subprocess.run(argv).returncode
    if rc or not user:
        return rc
    with tempfile.TemporaryDirectory(prefix="ddpkit-user-") as ctx:
        user_image.stage_context(spec, Path(ctx))
        argv = user_image.build_argv(engine, spec, Path(ctx), os.getuid(), os.getgid())
        print("+ " + " ".join(shell_quote(a) for a in argv), file=sys.stderr)
        return subprocess.run(argv).returncode


def after_render(spec: JobSpec, opts: argparse.Namespace, text: str) -> int:
    return build(spec, opts) if getattr(opts, "build", False) else 0
