"""``slipway``: sub-commands from each package, loaded lazily so that ``--help`` is instant.

Each package contributes a ``register(subparsers)`` function in its ``cli`` module that
adds its commands with argparse only; the heavy imports (TensorFlow, Beam) happen inside
the command handlers. A handler returns the process exit code. A module's
``USER_ERRORS`` lists the exceptions that mean "the input is wrong": they are printed as
one clear line (exit 2) instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

# Modules whose ``register`` adds sub-commands, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "research.data.cli",
    "research.tuning.cli",
    "training.cli",
    "compression.cli",
    "serving.cli",
    "ops.cli",
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

stderr = Console(stderr=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slipway",
        description="Take a TensorFlow model from research to production traffic.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def user_errors(handler: object) -> tuple[type[BaseException], ...]:
    """The input errors of the package whose command runs (only that package is asked)."""
    module = importlib.import_module(getattr(handler, "__module__", __name__))
    return tuple(getattr(module, "USER_ERRORS", ()))


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_extra_args", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra_args = extra
    try:
        return int(args.handler(args) or EXIT_OK)
    except user_errors(args.handler) as exc:
        stderr.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return EXIT_USAGE
    except KeyboardInterrupt:
        stderr.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
