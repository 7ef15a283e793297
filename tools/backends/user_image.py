"""Code shipping for Docker and Kubernetes: the workspace's image, one layer FROM the ddpkit image.

`ddpkit build` (make docker-build) builds the ddpkit image as `docker.kit_image`, then, when
the job names an image of its own (`image` != `docker.kit_image`), that image FROM it: the
workspace copied to /workspace (the image's WORKDIR) and its requirements pip-installed. One
rule for paths: the workspace's root is /workspace, so every relative path of the job file
(`script`, `args`, `[train]` paths) means the same file here and in the image.

    [docker]
    user_dir = "src"                    # ship only this directory (default: the workspace)
    requirements = "requirements.txt"  # default: the workspace's requirements.txt, if any

Runs, job records, virtualenvs and VCS data stay out (RUNS and data/ are volumes at run time).
Kubernetes runs the same image (workingDir /workspace): push it and set `image` to its name.
"""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from ddpkit.tools.backends.containers import CONTAINER_WORKDIR
from ddpkit.tools.jobspec import JobSpec, SpecError
from ddpkit.train import dataclass_fields

WORKDIR = PurePosixPath(CONTAINER_WORKDIR)
USER_REQUIREMENTS = "/opt/ddpkit/user-requirements.txt"
# Volumes are mounted here at run time and would hide code copied below them.
MOUNTED = ("runs", "data")
# Never shipped: outputs, job records, environments and VCS data of the workspace.
IGNORED = ("__pycache__", "*.pyc", ".git", ".venv", "venv", "runs", "data", ".ddpkit")
REQUIREMENTS = "requirements.txt"


def wanted(spec: JobSpec) -> bool:
    """The job names an image of its own: build it from the workspace."""
    return spec.image != spec.docker.kit_image


def _host(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else Path.cwd() / p  # the workspace (submit.run)


def source_dir(spec: JobSpec) -> Path:
    """What is shipped: docker.user_dir, else the whole workspace."""
    return _host(spec.docker.user_dir) if spec.docker.user_dir else Path.cwd()


def requirements(spec: JobSpec) -> Path | None:
    if spec.docker.requirements:
        return _host(spec.docker.requirements)
    default = Path.cwd() / REQUIREMENTS
    return default if default.is_file() else None


def dest(user_dir: str | None) -> PurePosixPath:
    """Where the shipped code lands: the workspace is /workspace, a user_dir keeps its path
    relative to the workspace below it."""
    if not user_dir:
        return WORKDIR
    p = Path(user_dir)
    if p.is_absolute():
        ws = Path.cwd()
        p = p.relative_to(ws) if p.is_relative_to(ws) else p
    return WORKDIR / PurePosixPath(p.as_posix())


def check(spec: JobSpec) -> None:
    """What would make the image wrong, from the spec alone (render calls it); one line
    each (SpecError, exit 2)."""
    d = spec.docker
    if not wanted(spec):
        if d.user_dir or d.requirements:
            raise SpecError(
                f"image {spec.image!r} is the ddpkit image itself (docker.kit_image); give your "
                "image its own name, e.g. --set image=myproject:latest"
            )
        return
    if not dataclass_fields.is_plain_token(d.kit_image):
        raise SpecError(f"docker.kit_image {d.kit_image!r} is not an image reference")
    if d.user_dir:
        p = Path(d.user_dir)
        if ".." in p.parts or (p.is_absolute() and not p.is_relative_to(Path.cwd())):
            raise SpecError(
                f"docker.user_dir {d.user_dir!r} is outside the workspace {Path.cwd()}: the "
                "image holds the workspace at /workspace; name a directory below it (or unset "
                "it to ship the whole workspace)"
            )
        rel = dest(d.user_dir).relative_to(WORKDIR).parts
        if rel and rel[0] in MOUNTED:
            raise SpecError(
                f"docker.user_dir {d.user_dir!r} lands in /workspace/{rel[0]}, where a volume is "
                "mounted at run time and hides it; move the code to another directory"
            )


def code_note(spec: JobSpec) -> str | None:
    """One line when the job's own code is not in the image it names (render prints it)."""
    if spec.default_entry or wanted(spec):
        return None
    what = spec.script or spec.module
    return (
        f"note: {what} is your code, but image {spec.image!r} is the ddpkit image, which does "
        'not hold it; set image = "<project>:latest" and run `ddpkit build`'
    )


def check_files(spec: JobSpec) -> None:
    """Before a build: the files exist, and nothing shipped would shadow the kit."""
    d = spec.docker
    if (source_dir(spec) / "ddpkit" / "__init__.py").is_file():
        raise SpecError(
            f"{source_dir(spec)} holds a ddpkit/ package (the kit's own checkout?): in the "
            "image it would shadow the installed kit; build from your project's directory"
        )
    if d.user_dir and not _host(d.user_dir).is_dir():
        raise SpecError(
            f"docker.user_dir {d.user_dir!r} is not a directory in the workspace {Path.cwd()}"
        )
    if d.requirements and not _host(d.requirements).is_file():
        raise SpecError(
            f"docker.requirements {d.requirements!r} is not a file in the workspace {Path.cwd()}"
        )


def containerfile(spec: JobSpec) -> str:
    """The generated Containerfile of the user layer (its context: see stage_context)."""
    d = spec.docker
    lines = [
        "# Generated by ddpkit (ddpkit.tools.backends.user_image): the workspace and its",
        "# requirements on top of the ddpkit image. Rebuild with `ddpkit build`.",
        "ARG KIT_IMAGE",
        "FROM ${KIT_IMAGE}",
        "ARG UID=1000",
        "ARG GID=1000",
    ]
    lines.append(f"COPY user/ {dest(d.user_dir)}/")
    if requirements(spec) is not None:
        # pip runs in /workspace, so relative paths in the file (a wheel shipped in the
        # workspace, say) resolve as they do in the workspace; root only for the install.
        lines += [
            "USER 0",
            f"COPY requirements.txt {USER_REQUIREMENTS}",
            f"RUN python -m pip install --no-cache-dir -r {USER_REQUIREMENTS}",
            "USER ${UID}:${GID}",
        ]
    return "\n".join(lines) + "\n"


def stage_context(spec: JobSpec, ctx: Path) -> None:
    """Fill the build context: the Containerfile, user/ (the shipped code) and
    requirements.txt."""
    (ctx / "Containerfile").write_text(containerfile(spec))
    shutil.copytree(source_dir(spec), ctx / "user", ignore=shutil.ignore_patterns(*IGNORED))
    req = requirements(spec)
    if req is not None:
        shutil.copyfile(req, ctx / "requirements.txt")


def build_argv(engine: str, spec: JobSpec, ctx: Path, uid: int, gid: int) -> list[str]:
    argv = [engine, "build", "-f", str(ctx / "Containerfile"), "-t", spec.image]
    argv += ["--build-arg", f"KIT_IMAGE={spec.docker.kit_image}"]
    if uid != 0:  # the same user as the ddpkit image (docker.build_argv)
        argv += ["--build-arg", f"UID={uid}", "--build-arg", f"GID={gid}"]
    return argv + [str(ctx)]
