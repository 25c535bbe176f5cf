"""``slipway``: sub-commands from each package, loaded lazily so that ``--help`` is instant.

Each package contributes a ``register(subparsers)`` function in its ``cli`` module that
adds its commands with argparse only; the heavy imports (TensorFlow, Beam) happen inside
the command handlers. A handler returns the process exit code. A module's
``USER_ERRORS`` lists the exceptions that mean "the input is wrong": they are printed as
one clear line (exit 2) instead of a traceback. Any other exception is a bug: its
traceback goes to a crash log, the screen gets one line naming that file, and the exit
code is its own (70), so a script can tell a bug from a refusal or a failed check. An
``OSError`` (a full disk, a permission) takes the same path without being called a bug.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from slipway.start_up_noise import quiet_start_up_noise

# Modules whose ``register`` adds sub-commands, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "research.data.cli",
    "training.cli",
    "compression.cli",
    "serving.cli",
    "ops.cli",
    "ops.balancer_cli",
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # sysexits' EX_SOFTWARE: an unexpected error, a bug to report
EXIT_INTERRUPTED = 130
PIPE_COLUMNS = 4096

stderr = Console(stderr=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slipway",
        description="Take a TensorFlow model from research to production traffic.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    for command in leaf_parsers(parser):
        command.add_argument(
            "--verbose",
            action="store_true",
            help="show TensorFlow's native start-up messages too (hidden by default)",
        )
    return parser


def leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers that run a command (those without sub-commands of their own)."""
    choices = [
        child
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for child in dict.fromkeys(action.choices.values())
    ]
    if not choices:
        return [parser]
    return [leaf for child in choices for leaf in leaf_parsers(child)]


def user_errors(handler: object) -> tuple[type[BaseException], ...]:
    """The input errors of the package whose command runs (only that package is asked)."""
    module = importlib.import_module(getattr(handler, "__module__", __name__))
    return tuple(getattr(module, "USER_ERRORS", ()))


@contextlib.contextmanager
def full_width_when_piped() -> Iterator[None]:
    """Let rich tables keep every column when stdout is a pipe or a file.

    rich measures such an output as 80 columns wide and cuts tables to fit; it reads
    ``COLUMNS`` each time it measures, so the variable is set while a command runs (and
    put back after, for callers of ``main`` in the same process).
    """
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        yield
        return
    os.environ["COLUMNS"] = str(PIPE_COLUMNS)
    try:
        yield
    finally:
        os.environ.pop("COLUMNS", None)


def main(argv: Sequence[str] | None = None, *, quiet_start_up: bool = False) -> int:
    """Run one command and return its exit code.

    ``quiet_start_up`` is for the ``slipway`` program itself: it hides TensorFlow's and
    Beam's start-up notices by taking over file descriptor 2 for the life of the
    process, which a caller of ``main`` in its own process (a test, a notebook) does
    not want.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_extra_args", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra_args = extra
    if quiet_start_up and not getattr(args, "verbose", False):
        quiet_start_up_noise()
    try:
        with full_width_when_piped():
            return int(args.handler(args) or EXIT_OK)
    except user_errors(args.handler) as exc:
        # Unwrapped: a "file:line: key: problem" message stays one line to copy or grep.
        stderr.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_USAGE
    except KeyboardInterrupt:
        stderr.print("interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a raw traceback
        log = write_crash_log(exc, argv if argv is not None else sys.argv[1:])
        # The system refusing (a full disk, a permission) is not a bug, but is as unexpected.
        refusal = system_refusal(exc)
        if refusal is not None:
            what, message, blame = "the system refused", str(refusal), ""
        else:
            what, message = f"unexpected {type(exc).__name__}", first_line(exc)
            blame = "a bug in slipway; "
        stderr.print(
            f"[bold red]error:[/] {what}: {escape(message)} "
            f"({blame}the traceback is in {escape(str(log))})",
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_INTERNAL


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (TensorFlow's run to pages)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else "(no message)"


def system_refusal(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind ``exc``, if one is: itself, or what it was raised while
    handling (Beam, for one, re-raises a worker's error as a ``RuntimeError``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def write_crash_log(exc: BaseException, argv: Sequence[str]) -> Path:
    """Write ``exc``'s traceback and the command line to a new file; its path.

    The directory is ``SLIPWAY_CRASH_DIR``, else ``slipway-crashes`` in the system's
    temporary directory: somewhere always writable, even in a read-only container.
    """
    directory = Path(
        os.environ.get("SLIPWAY_CRASH_DIR") or Path(tempfile.gettempdir()) / "slipway-crashes"
    )
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    handle, name = tempfile.mkstemp(prefix=f"{stamp}-", suffix=".log", dir=directory)
    with os.fdopen(handle, "w", encoding="utf-8") as log:
        log.write(f"command: slipway {shlex.join(argv)}\n")
        log.write(f"python: {sys.version.split()[0]}\n\n")
        log.write("".join(traceback.format_exception(exc)))
    return Path(name)


def run() -> None:
    """The ``slipway`` program."""
    sys.exit(main(quiet_start_up=True))


if __name__ == "__main__":
    run()
