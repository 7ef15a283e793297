"""Container test harness: this machine's podman quirks, kept out of the product.

Facts of the CI machines (../shared/facts/environment.md), not of users' machines:
- no Docker engine (only the client); Debian's podman works as root, with
  `--isolation=chroot` for builds (set here through BUILDAH_ISOLATION) and the `runc`
  runtime for runs (crun fails on cgroups here);
- no CAP_SYS_RESOURCE: a container may not raise a hard rlimit above the host's, so
  `--ulimit memlock=-1` is clamped to the host's hard limit, and the default nofile/nproc
  limits are refused unless given explicitly;
- no registry for images: the CPU base image is made locally (debootstrap + Python + the
  torch this venv runs, copied in from its site-packages) and kept in podman's store;
  ~/.cache/ddpkit holds only its lock (DDPKIT_CACHE overrides);
- disk is shared and sometimes short (a CI run once failed with ENOSPC): the base takes one
  copy of torch (~4.5 GB: PyPI's torch is the CUDA build, and its nvidia-* libraries are
  needed to import it), not a second download of the wheels, a layer holding them and a
  `podman save` tarball on top (about 20 GB before);
- the CA bundle: pip inside a build reaches PyPI only with the host's bundle mounted. The
  base recipe below needs no network inside the build; `ca_bundle_flags()` is here for
  builds that do.

`python -m tests.container_harness` builds the base image (or finds it in podman's store) and prints its name.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.metadata
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SUITE = "bookworm"  # python 3.11, the ABI of this venv's cp311 wheels
MIRROR = "http://deb.debian.org/debian"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the official PyTorch runtime image offers the trainer: python, torch and numpy on
# PATH. torch's own requirements come along (its nvidia-* libraries: the CUDA build does
# not import without them); triton does not (only torch.compile's GPU kernels use it, and
# it is 0.9 GB), nor torchvision (imported only by the vision models).
ROOTS = ("torch", "numpy")
LEAVE_OUT = {"triton", "torchvision"}
SITE = "/opt/venv/lib/python3.11/site-packages"

# The packages arrive through a build-time bind mount, so no layer holds a second copy.
BASE_RECIPE = """\
FROM {os_image}
RUN --mount=type=bind,source=site,target=/tmp/site \\
    python3 -m venv /opt/venv && cp -a /tmp/site/. {site}/
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"""


@functools.cache
def base_dists() -> tuple[importlib.metadata.Distribution, ...]:
    """ROOTS as installed here and what they require on this platform (extras followed:
    torch asks for cuda-toolkit[cudart,...]), LEAVE_OUT aside."""
    todo: list[tuple[str, str]] = [(r, "") for r in ROOTS]
    seen: set[tuple[str, str]] = set()
    dists: dict[str, importlib.metadata.Distribution] = {}
    while todo:
        name, extra = todo.pop()
        name = canonicalize_name(name)
        if (name, extra) in seen or name in LEAVE_OUT:
            continue
        seen.add((name, extra))
        dist = dists.setdefault(name, importlib.metadata.distribution(name))
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo += [(req.name, "")] + [(req.name, e) for e in req.extras]
    return tuple(dists[n] for n in sorted(dists))


_PINS = "|".join(f"{d.metadata['Name']}=={d.version}" for d in base_dists())
_KEY = hashlib.sha256(f"{SUITE}|{_PINS}|{BASE_RECIPE}".encode()).hexdigest()[:10]
OS_IMAGE = f"localhost/ddpkit-debian-py:{SUITE}"
BASE_IMAGE = f"localhost/ddpkit-cpu-base:torch{importlib.metadata.version('torch')}-{_KEY}"

Log = Callable[[str], None]


def cache_dir() -> Path:
    return Path(os.environ.get("DDPKIT_CACHE", Path.home() / ".cache" / "ddpkit"))


def engine() -> str | None:
    """podman when installed (with runc), else a docker whose engine answers, else None."""
    if shutil.which("podman") and shutil.which("runc"):
        return "podman"
    if shutil.which("docker"):
        ok = subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
        if ok:
            return "docker"
    return None


def skip_reason() -> str | None:
    """Why the container tests cannot run here, or None when they can."""
    if engine() is None:
        return (
            "no container engine: install podman and runc (apt-get install podman runc) "
            "or start a Docker engine"
        )
    if engine() == "podman" and not _image_exists(BASE_IMAGE) and not shutil.which("debootstrap"):
        return (
            f"no cached {BASE_IMAGE} and no debootstrap to build it (apt-get install debootstrap)"
        )
    return None


def engine_env() -> dict[str, str]:
    """Environment for engine commands (builds run in a chroot here)."""
    env = dict(os.environ)
    if engine() == "podman":
        env["BUILDAH_ISOLATION"] = "chroot"
    return env


def ca_bundle_flags() -> list[str]:
    """`podman build` flags that let pip inside a RUN step reach PyPI on this machine."""
    if not Path(CA_BUNDLE).is_file():
        return []
    return ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro", "--env", f"PIP_CERT={CA_BUNDLE}"]


def _hard_limit(res: int) -> int | None:
    hard = resource.getrlimit(res)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def adapt_run_argv(argv: list[str]) -> list[str]:
    """Turn a product `docker run ...` argv into one this machine accepts.

    Keeps every product flag except: the engine (podman --runtime runc), --gpus (no GPU
    here), and --ulimit values above the host's hard limits (clamped); adds explicit nofile
    and nproc limits, which podman otherwise sets from defaults this machine refuses.
    """
    if len(argv) < 2 or argv[1] != "run":
        raise ValueError(f"not a `<engine> run` command line: {argv[:2]}")
    eng = engine() or argv[0]
    limits = {
        "memlock": _hard_limit(resource.RLIMIT_MEMLOCK),
        "stack": _hard_limit(resource.RLIMIT_STACK),
        "nofile": _hard_limit(resource.RLIMIT_NOFILE),
        "nproc": _hard_limit(resource.RLIMIT_NPROC),
    }
    opts: list[str] = ["--runtime", "runc"] if eng == "podman" else []
    seen: set[str] = set()
    i = 2
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg == "--gpus":
            i += 2
            continue
        if arg == "--ulimit":
            name, _, value = argv[i + 1].partition("=")
            seen.add(name)
            cap, soft = limits.get(name), value.split(":")[0]
            if cap is not None and (soft == "-1" or int(soft) > cap):
                value = f"{cap}:{cap}"
            opts += ["--ulimit", f"{name}={value}"]
            i += 2
            continue
        if not arg.startswith("--gpus="):
            opts.append(arg)
            # flags with a separate value (`-v a:b`, `--name x`); `--flag=value` needs none
            if "=" not in arg and arg not in _BOOLEAN_RUN_FLAGS:
                opts.append(argv[i + 1])
                i += 1
        i += 1
    for name in ("nofile", "nproc"):  # podman's defaults for these are refused here
        if name not in seen:
            opts += ["--ulimit", f"{name}=1024:1024"]
    return [eng, "run", *opts, *argv[i:]]


_BOOLEAN_RUN_FLAGS = {"--rm", "-d", "--detach", "-i", "-t", "-it", "--init", "--privileged"}


def _image_exists(ref: str) -> bool:
    eng = engine()
    if eng is None:
        return False
    cmd = [eng, "image", "exists", ref] if eng == "podman" else [eng, "image", "inspect", ref]
    return subprocess.run(cmd, capture_output=True).returncode == 0


@contextmanager
def _lock() -> Iterator[None]:
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "base.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _run(cmd: list[str], log: Log, **kw: object) -> None:
    log("+ " + " ".join(cmd))
    subprocess.run(cmd, check=True, env=engine_env(), **kw)  # type: ignore[call-overload]


def ensure_base_image(log: Log = print) -> tuple[str, str]:
    """(image, how): from podman's store, or built (minutes)."""
    eng = engine()
    if eng is None:
        raise RuntimeError(skip_reason() or "no container engine")
    with _lock():
        if _image_exists(BASE_IMAGE):
            return BASE_IMAGE, "store"
        _build_base(eng, log)
        return BASE_IMAGE, "built"


def _stage_site(dest: Path) -> int:
    """Hard-link (copy across file systems) base_dists()' files into dest, laid out as
    site-packages; returns the bytes staged. Files a RECORD puts outside site-packages
    (console scripts) stay out: the image's own venv has its bin/."""
    total = 0
    for dist in base_dists():
        site = Path(dist.locate_file("")).resolve()
        for rel in dist.files or []:
            src = Path(dist.locate_file(rel)).resolve()
            if not src.is_file() or not src.is_relative_to(site):
                continue
            out = dest / src.relative_to(site)
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, out)
            except OSError:
                shutil.copy2(src, out)
            total += src.stat().st_size
    return total


def _build_base(eng: str, log: Log) -> None:
    with tempfile.TemporaryDirectory(prefix="ddpkit-base-", dir=cache_dir()) as work:
        ctx = Path(work) / "ctx"
        size = _stage_site(ctx / "site")
        log(
            f"staged {_PINS.count('|') + 1} distributions ({size / 2**30:.1f} GiB) for {BASE_IMAGE}"
        )
        if not _image_exists(OS_IMAGE):
            rootfs = Path(work) / "rootfs"
            t0 = time.monotonic()
            _run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    "--include=python3,python3-venv,ca-certificates",
                    SUITE,
                    str(rootfs),
                    MIRROR,
                ],
                log,
                stdout=subprocess.DEVNULL,
            )
            log(f"debootstrap: {time.monotonic() - t0:.0f} s")
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            _run(
                [eng, "import", "--change", f"ENV {PATH_ENV}", "-", OS_IMAGE], log, stdin=tar.stdout
            )
            if tar.wait() != 0:
                raise RuntimeError("tar of the debootstrap root failed")
            shutil.rmtree(rootfs, ignore_errors=True)
        (ctx / "Containerfile").write_text(BASE_RECIPE.format(os_image=OS_IMAGE, site=SITE))
        _run(
            [eng, "build", "-q", "-t", BASE_IMAGE, "-f", str(ctx / "Containerfile"), str(ctx)], log
        )


if __name__ == "__main__":
    t0 = time.monotonic()
    ref, how = ensure_base_image(lambda m: print(m, file=sys.stderr))
    print(f"{ref} ({how}, {time.monotonic() - t0:.0f} s)")
