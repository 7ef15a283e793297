"""The doctor's network checks: socket interfaces named by NCCL/gloo variables,
InfiniBand devices, this node's hostname, and the rendezvous endpoint (DNS, then TCP)."""

from __future__ import annotations

import ipaddress
import socket
import time
from pathlib import Path

from ddpkit.tools.doctor.checks import Finding

# --- network interfaces and InfiniBand --------------------------------------------------------


def nccl_ifname_matches(spec: str, names: list[str]) -> list[str]:
    """Interfaces NCCL_SOCKET_IFNAME selects: a comma list of prefixes; '=' makes the list
    exact names, '^' excludes (NCCL docs, NCCL_SOCKET_IFNAME)."""
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    items = [s for s in spec.split(",") if s]

    def hit(name: str) -> bool:
        return any(name == s if exact else name.startswith(s) for s in items)

    return [n for n in names if hit(n) != exclude]


def interfaces(sys_net: Path = Path("/sys/class/net")) -> dict[str, str]:
    """name -> operstate ('up', 'down', 'unknown': loopback and some virtual NICs)."""
    out = {}
    for _, name in socket.if_nameindex():
        try:
            out[name] = (sys_net / name / "operstate").read_text().strip()
        except OSError:
            out[name] = "unknown"
    return out


def ifname_findings(env: dict[str, str], ifaces: dict[str, str], multi_node: bool) -> list[Finding]:
    out = []
    names = sorted(ifaces)
    avail = ", ".join(f"{n} ({ifaces[n]})" for n in names)
    spec = env.get("NCCL_SOCKET_IFNAME")
    if spec:
        chosen = nccl_ifname_matches(spec, names)
        if not chosen:
            out.append(
                Finding(
                    "nccl-ifname",
                    "fail",
                    f"NCCL_SOCKET_IFNAME={spec} matches no interface here (interfaces: {avail})",
                    "set NCCL_SOCKET_IFNAME to the interface of the cluster network "
                    "(e.g. =eth0, or a prefix like ib), or unset it to let NCCL choose",
                )
            )
        elif all(ifaces[c] == "down" for c in chosen):
            out.append(
                Finding(
                    "nccl-ifname",
                    "fail",
                    f"NCCL_SOCKET_IFNAME={spec} selects only interfaces that are down: {', '.join(chosen)}",
                    "pick an interface that is up (ip link)",
                )
            )
        elif multi_node and chosen == ["lo"]:
            out.append(
                Finding(
                    "nccl-ifname",
                    "fail",
                    f"NCCL_SOCKET_IFNAME={spec} selects only the loopback on a multi-node job",
                    "use the interface other nodes reach this one on",
                )
            )
        else:
            out.append(
                Finding("nccl-ifname", "ok", f"NCCL_SOCKET_IFNAME={spec} -> {', '.join(chosen)}")
            )
    gloo = env.get("GLOO_SOCKET_IFNAME")
    if gloo:
        missing = [n for n in gloo.split(",") if n and n not in ifaces]
        if missing:
            out.append(
                Finding(
                    "gloo-ifname",
                    "fail",
                    f"GLOO_SOCKET_IFNAME={gloo} names missing interface(s) {', '.join(missing)} "
                    f"(interfaces: {avail})",
                    "GLOO_SOCKET_IFNAME takes exact names: set it to an existing interface, or unset it",
                )
            )
        else:
            out.append(Finding("gloo-ifname", "ok", f"GLOO_SOCKET_IFNAME={gloo}"))
    if not spec and not gloo:
        out.append(
            Finding("ifname", "info", f"no *_SOCKET_IFNAME set; NCCL/gloo choose among {avail}")
        )
    for var in ("NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
        if env.get(var) == "1":
            out.append(
                Finding(
                    "nccl-env",
                    "warn",
                    f"{var}=1: NCCL falls back to a slower transport",
                    f"unset {var} unless it works around a known fault",
                )
            )
    return out


def ib_findings(sys_ib: Path, hca: str | None, ib_disabled: bool) -> list[Finding]:
    devices = sorted(p.name for p in sys_ib.iterdir()) if sys_ib.is_dir() else []
    if not devices:
        if hca:
            return [
                Finding(
                    "infiniband",
                    "fail",
                    f"NCCL_IB_HCA={hca} but no InfiniBand device exists",
                    "unset NCCL_IB_HCA",
                )
            ]
        return [
            Finding(
                "infiniband", "info", "no InfiniBand devices: NCCL uses TCP sockets between nodes"
            )
        ]
    active = []
    for dev in devices:
        for port in sorted((sys_ib / dev / "ports").glob("*")):
            try:
                if "ACTIVE" in (port / "state").read_text():
                    active.append(f"{dev}:{port.name}")
            except OSError:
                continue
    out = [
        Finding(
            "infiniband",
            "ok" if active else "warn",
            f"devices {', '.join(devices)}; active ports: {', '.join(active) or 'none'}",
            None if active else "check the cables/subnet manager (ibstat)",
        )
    ]
    if hca:
        chosen = nccl_ifname_matches(hca, devices)  # same prefix/^/= syntax; ':port' suffixes
        if not chosen and not any(h.split(":")[0] in devices for h in hca.lstrip("^=").split(",")):
            out.append(
                Finding(
                    "infiniband",
                    "fail",
                    f"NCCL_IB_HCA={hca} matches no device ({', '.join(devices)})",
                    "set NCCL_IB_HCA to existing devices (ibv_devices) or unset it",
                )
            )
    if ib_disabled:
        out.append(
            Finding(
                "infiniband",
                "warn",
                "InfiniBand present but NCCL_IB_DISABLE=1",
                "unset NCCL_IB_DISABLE",
            )
        )
    return out


# --- rendezvous -----------------------------------------------------------------------------


def parse_endpoint(text: str, default_port: int = 29400) -> tuple[str, int]:
    text = text.strip()
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
        if ":" in text:  # only a bare IPv6 address may hold several colons
            try:
                ipaddress.IPv6Address(text)
            except ValueError:
                raise ValueError(f"rendezvous endpoint {text!r} is not HOST:PORT") from None
    if not host or (port and not port.isdigit()):
        raise ValueError(f"rendezvous endpoint {text!r} is not HOST:PORT")
    return host, int(port) if port else default_port


def rendezvous_findings(host: str, port: int, timeout: float, multi_node: bool) -> list[Finding]:
    ep = f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return [
            Finding(
                "rdzv-resolve",
                "fail",
                f"rendezvous host {host} does not resolve ({e.strerror})",
                "use a name every node resolves (SLURM: the first of scontrol show hostnames; "
                "Kubernetes: the master Service) or an IP; check DNS and /etc/hosts",
            )
        ]
    addrs = sorted({i[4][0] for i in infos})
    out = [Finding("rdzv-resolve", "ok", f"{host} -> {', '.join(addrs)}")]
    if multi_node and all(a.startswith("127.") or a == "::1" for a in addrs):
        out.append(
            Finding(
                "rdzv-resolve",
                "fail",
                f"{host} resolves to loopback on a multi-node job: other nodes cannot reach it",
                "use the head node's routable name or IP (check /etc/hosts maps the hostname to 127.0.1.1)",
            )
        )
    deadline, err = time.monotonic() + timeout, "timed out"
    while True:  # retry: the rendezvous host may still be starting
        t0 = time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.2, deadline - t0)):
                ms = (time.monotonic() - t0) * 1000
            out.append(Finding("rdzv-connect", "ok", f"TCP connect to {ep} in {ms:.1f} ms"))
            return out
        except ConnectionRefusedError:
            err = "connection refused: nothing listens there"
        except TimeoutError:
            err = f"no answer within {timeout:g} s (a firewall, or the wrong network)"
        except OSError as e:
            err = e.strerror or str(e)
        if time.monotonic() + 0.5 >= deadline:
            break
        time.sleep(0.5)
    out.append(
        Finding(
            "rdzv-connect",
            "fail",
            f"cannot open a TCP connection to {ep}: {err}",
            "start the job's node rank 0 first (its torchrun hosts the c10d store), use the same "
            "--rdzv-endpoint / MASTER_PORT on every node, and open the port in the firewall",
        )
    )
    return out


def hostname_finding(multi_node: bool, gloo_ifname: str | None) -> Finding:
    """gloo binds to the address this node's hostname resolves to, unless told an interface."""
    name = socket.gethostname()
    fix = "add the hostname with its routable IP to /etc/hosts, or set GLOO_SOCKET_IFNAME"
    try:
        addr = socket.gethostbyname(name)
    except OSError:
        return Finding("hostname", "warn", f"this node's hostname {name} does not resolve", fix)
    if multi_node and addr.startswith("127.") and not gloo_ifname:
        return Finding(
            "hostname",
            "fail",
            f"{name} -> {addr} (loopback): gloo would tell other nodes to connect to {addr}",
            fix,
        )
    return Finding("hostname", "ok", f"{name} -> {addr}")
