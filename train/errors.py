"""One error type for the user's mistakes and one CLI wrapper for every entry point.

`UserError` carries a message that names the problem and the fix; `ConfigError` is the
trainer's kind (a flag, a config value, a model/dataset/loss name), here at the bottom so that
the registry's lookups and the config both raise it. `run_cli(main)` runs a tool's main
function and turns a UserError into one line on stderr and exit status 2, and a closed stdout
(`tool ... | head`) into a quiet exit instead of a BrokenPipeError traceback.
`closest` / `valid_keys` name what a mistyped flag or key most likely meant, for every parser
and every table of keys. Torch-free: tools import it for a fast --help.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Iterable, Sequence

from ddpkit.train.contract import EXIT_BAD_INPUT, EXIT_FAILED


class UserError(ValueError):
    """Bad user input: the message names the problem and the fix."""


class ConfigError(UserError):
    """A bad training flag, config file value or combination (one line, exit 2)."""


def closest(word: str, choices: Iterable[str]) -> str | None:
    """What a mistyped `word` most likely meant: the shortest choice it begins (an
    abbreviation: `--gpu` -> `--gpus`), else the nearest by difflib's ratio (>= 0.6), else
    None."""
    choices = list(dict.fromkeys(choices))
    starts = sorted((c for c in choices if c.startswith(word) and c != word), key=len)
    if starts:
        return starts[0]
    near = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return near[0] if near else None


def valid_keys(key: str, valid: Sequence[str], where: str = "") -> str:
    """The tail of every unknown-key message: the closest valid key first, then all of them,
    e.g. `did you mean nproc_per_node? valid keys in the top level: name, ...`."""
    near = closest(key.replace("-", "_"), valid)
    head = f"did you mean {near}? " if near else ""
    return f"{head}valid keys{f' in {where}' if where else ''}: {', '.join(valid)}"


def abbreviated(args: Iterable[str], flags: Iterable[str]) -> tuple[str, str] | None:
    """(the first of `args` that abbreviates one of `flags` without being one, that flag):
    what argparse's prefix matching would have taken silently (`--node` for `--nodes`)."""
    flags = list(flags)
    for arg in args:
        given = arg.split("=", 1)[0]
        if given.startswith("--") and len(given) > 2 and given not in flags:
            longer = sorted((f for f in flags if f.startswith(given)), key=len)
            if longer:
                return given, longer[0]
    return None


def no_abbreviation(prog: str, given: str, flag: str) -> str:
    return f"{prog}: unknown flag {given} (flags are never abbreviated); did you mean {flag}?"


class CliParser(argparse.ArgumentParser):
    """argparse whose usage errors are UserErrors: one line (no usage dump), exit 2 via run_cli.
    A module whose callers catch its own UserError subclass sets `error_class`.

    No prefix matching (allow_abbrev=False): argparse's default takes `--gpu` for `--gpus`,
    and a typo queued a real job. An abbreviation is refused in one line naming the flag it
    abbreviates, and an unknown flag is named with the closest real one."""

    error_class: type[UserError] = UserError
    # False where the flags left over are someone else's to read (submit's first pass, before
    # the backend's own flags are added): the final parse refuses abbreviations.
    refuse_abbreviations = True

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        short = (
            abbreviated(extras, self._option_string_actions) if self.refuse_abbreviations else None
        )
        if short:
            raise self.error_class(f"{no_abbreviation(self.prog, *short)} (see {self.prog} --help)")
        return namespace, extras

    def error(self, message: str) -> None:  # type: ignore[override]
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):  # name the closest real flag
            given = message.removeprefix(prefix).split()[0].split("=", 1)[0]
            # compared without the dashes every flag shares: with them `--no-such-flag` came
            # out "near" `--no-ckpt-final`
            names = [f[2:] for f in self._option_string_actions if f.startswith("--")]
            near = closest(given[2:], names) if given.startswith("--") else None
            if near:
                message += f"; did you mean --{near}?"
        raise self.error_class(f"{message} (see {self.prog} --help)")


def print_error(err: BaseException | str) -> None:
    print(f"error: {err}", file=sys.stderr, flush=True)


def run_cli(main: Callable[[], int | None]) -> int:
    """Call main(); UserError -> one line + exit 2; a closed stdout -> exit quietly."""
    try:
        code = main()
        sys.stdout.flush()
        return int(code or 0)
    except UserError as e:
        print_error(e)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # The reader went away (`| head`): point stdout at /dev/null so the interpreter's
        # final flush does not raise again (the recipe in Python's signal docs).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
