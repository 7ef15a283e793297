"""Container test harness: this machine's podman quirks, kept out of the product.

Facts of the CI machines (../shared/facts/environment.md), not of users' machines:
- no Docker engine (only the client); Debian's podman works as root, with
  `--isolation=chroot` for builds (set here through BUILDAH_ISOLATION) and the `runc`
  runtime for runs (crun fails on cgroups here);
- no CAP_SYS_RESOURCE: a container may not raise a hard rlimit above the host's, so
  `--ulimit memlock=-1` is clamped to the host's hard limit, and the default nofile/nproc
  limits are refused unless given explicitly;
- no registry for images: the CPU base image is made locally (debootstrap + Python + the
  CPU-only torch wheel that `pip download` copies from local disk) and cached, in podman's
  store and as a `podman save` tarball under ~/.cache/ddpkit (DDPKIT_CACHE overrides);
- the CA bundle: pip inside a build reaches PyPI only with the host's bundle mounted. The
  base recipe below needs no network inside the build (wheels are downloaded on the host and
  installed with --no-index); `ca_bundle_flags()` is here for builds that do.

`python -m tests.container_harness` builds (or loads) the base image and prints its name.
"""

from __future__ import annotations

import fcntl
import hashlib
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

TORCH_VERSION = "2.13.0"  # the CPU-only wheel on local disk (190 MB)
SUITE = "bookworm"  # python 3.11, matching the wheel's cp311 tag
MIRROR = "http://deb.debian.org/debian"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The base: what the official PyTorch runtime image offers train/ (python, torch, numpy
# on PATH), minus CUDA and torchvision (PyPI's torchvision does not import beside this
# CPU wheel).
BASE_RECIPE = """\
FROM {os_image}
COPY wheels/ /tmp/wheels/
RUN python3 -m venv /opt/venv \\
    && /opt/venv/bin/pip install --no-index --find-links /tmp/wheels torch=={torch} numpy \\
    && rm -rf /tmp/wheels /root/.cache
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"""
_KEY = hashlib.sha256(f"{SUITE}|{TORCH_VERSION}|{BASE_RECIPE}".encode()).hexdigest()[:10]
OS_IMAGE = f"localhost/ddpkit-debian-py:{SUITE}"
BASE_IMAGE = f"localhost/ddpkit-cpu-base:torch{TORCH_VERSION}-{_KEY}"

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
    if engine() == "podman" and not _base_available() and not shutil.which("debootstrap"):
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


def _tarball() -> Path:
    return cache_dir() / f"{BASE_IMAGE.rsplit('/', 1)[1].replace(':', '_')}.tar"


def _base_available() -> bool:
    return _tarball().is_file() or _image_exists(BASE_IMAGE)


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
    """(image, how): from podman's store, from the cached tarball, or built (minutes)."""
    eng = engine()
    if eng is None:
        raise RuntimeError(skip_reason() or "no container engine")
    with _lock():
        if _image_exists(BASE_IMAGE):
            return BASE_IMAGE, "store"
        tar = _tarball()
        if tar.is_file():
            _run([eng, "load", "-q", "-i", str(tar)], log)
            if _image_exists(BASE_IMAGE):
                return BASE_IMAGE, "tarball"
            log(f"{tar} did not hold {BASE_IMAGE}; rebuilding")
        _build_base(eng, log)
        tmp = tar.with_suffix(".tar.tmp")
        tmp.unlink(missing_ok=True)
        _run([eng, "save", "-o", str(tmp), BASE_IMAGE], log)
        tmp.rename(tar)
        return BASE_IMAGE, "built"


def _build_base(eng: str, log: Log) -> None:
    with tempfile.TemporaryDirectory(prefix="ddpkit-base-") as work:
        ctx = Path(work) / "ctx"
        (ctx / "wheels").mkdir(parents=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "-d", str(ctx / "wheels")]
        _run([*pip, f"torch=={TORCH_VERSION}", "numpy"], log)
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
        (ctx / "Containerfile").write_text(
            BASE_RECIPE.format(os_image=OS_IMAGE, torch=TORCH_VERSION)
        )
        _run(
            [eng, "build", "-q", "-t", BASE_IMAGE, "-f", str(ctx / "Containerfile"), str(ctx)], log
        )


if __name__ == "__main__":
    t0 = time.monotonic()
    ref, how = ensure_base_image(lambda m: print(m, file=sys.stderr))
    print(f"{ref} ({how}, {time.monotonic() - t0:.0f} s)")
