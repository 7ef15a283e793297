"""Small pure helpers over a job's values: argv flags, debug presets, SLURM times."""

from __future__ import annotations

import re
from typing import Any, Literal

DebugPreset = Literal["off", "warn", "info", "trace"]


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of the last `flag VALUE` or `flag=VALUE` in argv (argparse's rule: the last
    one wins), else None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def debug_env(preset: DebugPreset) -> dict[str, str]:
    """The environment of a debug preset. warn and up also dump the NCCL flight recorder
    when a collective times out, so a hang leaves evidence of which rank stopped where."""
    if preset == "off":
        return {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    env = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_DEBUG": "WARN",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_BUFFER_SIZE": "20000",
        "TORCH_DISTRIBUTED_DEBUG": "OFF",
    }
    if preset in ("info", "trace"):
        env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", TORCH_DISTRIBUTED_DEBUG="INFO")
    if preset == "trace":
        env.update(
            NCCL_DEBUG="TRACE",
            NCCL_DEBUG_SUBSYS="ALL",
            TORCH_DISTRIBUTED_DEBUG="DETAIL",
            TORCH_CPP_LOG_LEVEL="INFO",
        )
    return env


_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_time_minutes(text: str) -> int:
    """SLURM time formats (sbatch --time) to whole minutes, rounded up; raises ValueError."""
    m = _TIME_RE.match(text.strip())
    if not m or text.strip() in ("", "0"):
        raise ValueError(text)
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        hh, mm, ss = (parts + [0, 0])[:3]
        seconds = int(days) * 86400 + hh * 3600 + mm * 60 + ss
    elif len(parts) == 1:  # MM
        seconds = parts[0] * 60
    elif len(parts) == 2:  # MM:SS
        seconds = parts[0] * 60 + parts[1]
    else:  # HH:MM:SS
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    if seconds <= 0:
        raise ValueError(text)
    return -(-seconds // 60)


def drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_none(v) for v in value]
    return value
