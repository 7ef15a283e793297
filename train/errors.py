"""One error type for the user's mistakes and one CLI wrapper for every entry point.

`UserError` carries a message that names the problem and the fix; `ConfigError` is the
trainer's kind (a flag, a config value, a model/dataset/loss name), here at the bottom so that
the registry's lookups and the config both raise it. `run_cli(main)` runs a tool's main
function and turns a UserError into one line on stderr and exit status 2, and a closed stdout
(`tool ... | head`) into a quiet exit instead of a BrokenPipeError traceback.
Torch-free: tools import it for a fast --help.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ddpkit.train.contract import EXIT_BAD_INPUT, EXIT_FAILED


class UserError(ValueError):
    """Bad user input: the message names the problem and the fix."""


class ConfigError(UserError):
    """A bad training flag, config file value or combination (one line, exit 2)."""


class CliParser(argparse.ArgumentParser):
    """argparse whose usage errors are UserErrors: one line (no usage dump), exit 2 via run_cli.
    A module whose callers catch its own UserError subclass sets `error_class`."""

    error_class: type[UserError] = UserError

    def error(self, message: str) -> None:  # type: ignore[override]
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
