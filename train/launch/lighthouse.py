"""torchft's lighthouse, started without importing torch.

    python -m ddpkit.train.lighthouse --min_replicas 1 --bind [::]:29510 ...

torchft's own `torchft_lighthouse` command imports the `torchft` package, which imports torch:
10-15 s before the lighthouse listens on a loaded 2-core machine (over 60 s seen), while the
lighthouse itself is Rust in torchft's extension module, which links no torch. This loads that
module alone and runs the same main (the same flags: `torchft_lighthouse --help`).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

# The lighthouse's flags, as the kit starts it everywhere (train/replica_groups.py, the
# Kubernetes lighthouse pod): a group is gone 2 s after its last heartbeat, and a quorum
# waits at most 2 s for stragglers (torchft's defaults: 5 s and 60 s).
HEARTBEAT_TIMEOUT_MS = 2000
JOIN_TIMEOUT_MS = 2000
PORT = 29510  # torchft's default, where nothing else picks the port (Kubernetes)


def flags(port: int) -> list[str]:
    return [
        "--min_replicas", "1",
        "--bind", f"[::]:{port}",
        "--join_timeout_ms", str(JOIN_TIMEOUT_MS),
        "--heartbeat_timeout_ms", str(HEARTBEAT_TIMEOUT_MS),
    ]  # fmt: skip


def main() -> int:
    if sys.orig_argv[1:2] == ["-m"]:
        # The lighthouse parses the process's own argv after its first word: under `-m` that
        # is `-m ddpkit.train.lighthouse FLAGS`. Run this file as a script instead.
        os.execv(sys.executable, [sys.executable, __file__, *sys.argv[1:]])
    spec = importlib.util.find_spec("torchft")  # locates the package, does not run it
    if spec is None or not spec.submodule_search_locations:
        print("error: torchft is not installed: pip install 'ddpkit[ft]'", file=sys.stderr)
        return 2
    found = sorted(Path(spec.submodule_search_locations[0]).glob("_torchft*.so"))
    if not found:
        print(f"error: no torchft extension module in {spec.origin}", file=sys.stderr)
        return 2
    name = "torchft._torchft"
    loader = importlib.machinery.ExtensionFileLoader(name, str(found[0]))
    module_spec = importlib.util.spec_from_file_location(name, found[0], loader=loader)
    assert module_spec is not None
    module = importlib.util.module_from_spec(module_spec)
    loader.exec_module(module)
    return module.lighthouse_main() or 0


if __name__ == "__main__":
    sys.exit(main())
