"""The CLI reference (``docs/reference/cli.md``), generated from the ``slipway`` parsers.

Every command and sub-command that ``slipway.cli.build_parser`` registers, with its
description, usage, every option (its help, default and whether it is required) and its
exit codes, so the reference cannot drift from what the program accepts:
``tests/docs/test_reference_pages.py`` fails when the committed page and this output
differ. Regenerate it with::

    python -m slipway.cli_reference > docs/reference/cli.md

A command's exit codes are those its ``--help`` documents (an ``exit codes:`` block, or a
sentence ``Exit codes: 0 built; 3 …``; failing that, the sentence of the module that
defines its handler), else its entry in ``EXIT_CODES``, plus the codes ``slipway.cli.main``
gives every command (``COMMON_EXIT_CODES``).
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from contracts.config_reference import cell
from slipway.cli import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, build_parser

USAGE_WIDTH = 88  # usage lines wrapped as a terminal this wide would show them

COMMON_EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_USAGE: "the input is wrong: an unknown option or a bad value, or a file, key or value "
    "the one-line message names (nothing was changed)",
    EXIT_INTERNAL: "an unexpected error, a bug: one line names the crash log that holds the "
    "traceback (in `slipway-crashes` of the temporary directory, or `SLIPWAY_CRASH_DIR`)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}

# What each command's exit codes mean, for the commands whose --help does not say.
EXIT_CODES: dict[str, dict[int, str]] = {
    "slipway data show": {0: "the summary was printed"},
    "slipway serve": {
        0: "stopped by SIGTERM or SIGINT after finishing the requests in flight",
        1: "with --processes N: a worker could not start (the worker's own exit code when it "
        "had one, 1 when a signal ended it)",
    },
    "slipway publish": {
        0: "published",
        2: "not a SavedModel with a serving_default signature, or the version exists",
    },
    "slipway routing serve": {0: "stopped by SIGTERM or SIGINT"},
    "slipway canary start": {
        0: "the canary was promoted",
        1: "the canary was rolled back, or the controller stopped before the rollout "
        "finished (`slipway canary resume` picks it up)",
    },
    "slipway canary status": {0: "the status was printed"},
    "slipway canary pause": {
        0: "the rollout is paused",
        1: "the command was refused, or the running controller did not answer in time (the "
        "request stays queued)",
    },
    "slipway canary resume": {
        0: "the rollout resumed, or the rollout this command drove was promoted",
        1: "the command was refused, the running controller did not answer in time, or the "
        "rollout this command drove was rolled back",
    },
    "slipway canary promote": {
        0: "the canary is the stable version",
        1: "the command was refused, or the running controller did not answer in time",
    },
    "slipway canary abort": {
        0: "the rollout was aborted (canary weight 0)",
        1: "the command was refused, or the running controller did not answer in time",
    },
    "slipway canary rollback": {
        0: "the previous stable version serves again",
        1: "the command was refused, or the running controller did not answer in time",
    },
    "slipway canary history": {0: "the history was printed"},
    "slipway balancer nginx": {0: "the configuration was written"},
}

# "exit codes:" followed by indented "  CODE  meaning" lines (argparse's raw description).
_CODE_BLOCK = re.compile(r"^exit codes:\n((?:[ \t]+\S.*(?:\n|$))+)", re.MULTILINE | re.IGNORECASE)
_CODE_LINE = re.compile(r"^[ \t]+(\d+)[ \t]+(.*)$")
# "Exit codes: 0 built; 2 the spec …; 3 …." at the end of a description.
_CODE_SENTENCE = re.compile(r"\s*Exit codes: (\d+ .*)$", re.DOTALL)
_SENTENCE_SPLIT = re.compile(r"[;,]\s+(?=\d+\s)")


@dataclass(frozen=True)
class Command:
    """One command of the ``slipway`` program, as a section of the reference."""

    name: str  # "slipway canary start"
    summary: str  # the line its parent's --help lists it with
    parser: argparse.ArgumentParser
    subcommands: tuple[Command, ...]


def commands(parser: argparse.ArgumentParser | None = None) -> list[Command]:
    """The program's commands in ``--help`` order, each with its sub-commands."""
    return list(_children(parser or build_parser()))


def _children(parser: argparse.ArgumentParser) -> Iterator[Command]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, child in action.choices.items():
                subcommands = tuple(_children(child))
                yield Command(child.prog, summaries[name], child, subcommands)


def leaves(items: Sequence[Command]) -> Iterator[Command]:
    """The commands that run something (those without sub-commands), in order."""
    for command in items:
        yield from leaves(command.subcommands) if command.subcommands else [command]


# ---------------------------------------------------------------------------- exit codes


def split_exit_codes(text: str) -> tuple[str, dict[int, str]]:
    """A description without the exit codes it documents, and those codes."""
    block = _CODE_BLOCK.search(text)
    if block:
        codes: dict[int, str] = {}
        last = None
        for line in block.group(1).splitlines():
            found = _CODE_LINE.match(line)
            if found and not line.startswith(" " * 5):
                last = int(found.group(1))
                codes[last] = found.group(2).strip()
            elif last is not None:  # a continuation line of the last code's meaning
                codes[last] += " " + line.strip()
        return (text[: block.start()] + text[block.end() :]).strip(), codes
    sentence = _CODE_SENTENCE.search(text)
    if sentence:
        parts = _SENTENCE_SPLIT.split(sentence.group(1).strip().removesuffix("."))
        codes = {int(code): meaning for code, meaning in (part.split(" ", 1) for part in parts)}
        return text[: sentence.start()].strip(), codes
    return text.strip(), {}


def documented_exit_codes(command: Command) -> dict[int, str]:
    """The codes the command's own --help documents, else its handler module's docstring."""
    codes = split_exit_codes(command.parser.description or "")[1]
    if codes:
        return codes
    module = importlib.import_module(command.parser.get_default("handler").__module__)
    return split_exit_codes(module.__doc__ or "")[1]


def exit_codes(command: Command) -> dict[int, str]:
    """Every exit code of a command with its meaning, in order. A command's own meaning of
    2 comes first; an option or value argparse refuses is still 2 as well."""
    own = dict(documented_exit_codes(command) or EXIT_CODES.get(command.name, {}))
    if EXIT_USAGE in own:
        own[EXIT_USAGE] += "; or any other wrong input (an unknown option, a bad value)"
    return dict(sorted({**COMMON_EXIT_CODES, **own}.items()))


# ------------------------------------------------------------------------------- options


def usage(parser: argparse.ArgumentParser) -> str:
    """The usage line(s) as ``--help`` prints them on a terminal ``USAGE_WIDTH`` wide."""
    formatter = parser.formatter_class(prog=parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def option_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(option, help, default) for every argument ``--help`` shows, but ``-h`` itself."""
    formatter = parser.formatter_class(prog=parser.prog, width=USAGE_WIDTH)
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        text = formatter._expand_help(action) if action.help else ""
        rows.append((_invocation(formatter, action), text, _default(action, text)))
    return rows


def _invocation(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    """``--publish [METHOD]``, ``-o, --output OUTPUT``, or a positional's name."""
    if not action.option_strings:
        return f"`{formatter._format_args(action, action.dest)}`"
    flags = ", ".join(f"`{flag}`" for flag in action.option_strings)
    if action.nargs == 0:
        return flags
    return f"{flags} `{formatter._format_args(action, action.dest.upper())}`"


def _default(action: argparse.Action, text: str) -> str:
    """``required``, the default value, or nothing when there is none to show (a flag, or a
    help that says the default itself)."""
    if action.required:
        return "required"
    flag = action.nargs == 0
    if flag or action.default in (None, [], argparse.SUPPRESS) or "default" in text.lower():
        return ""
    value = str(action.default) if isinstance(action.default, Path) else action.default
    return f"`{value}`"


# ------------------------------------------------------------------------------ document

HEADER = """\
# CLI reference

Every `slipway` command with its options and exit codes, generated from the program's
argument parsers by

    python -m slipway.cli_reference > docs/reference/cli.md

and checked by a test, so it cannot drift from what the program accepts.
`slipway --help` lists the commands and each has its own `--help`. Options a command does
not know are an error (exit 2), except where a command says it passes them on.
"""


def render() -> str:
    """The whole reference as Markdown: a summary, then a section per command."""
    tree = commands()
    lines = [HEADER, "## Commands\n", "| command | what it does |", "|---|---|"]
    lines += [f"| [`{c.name}`](#{_anchor(c.name)}) | {cell(c.summary)} |" for c in leaves(tree)]
    lines += ["\n## Exit codes every command shares\n", *_code_table(COMMON_EXIT_CODES)]
    for command in tree:
        lines += _section(command, level=2)
    return "\n".join(lines) + "\n"


def _section(command: Command, level: int) -> list[str]:
    description = split_exit_codes(command.parser.description or command.summary)[0]
    lines = [f"\n{'#' * level} {command.name}\n", _markdown(description)]
    if command.subcommands:
        for sub in command.subcommands:
            lines += _section(sub, level + 1)
        return lines
    lines += ["", "```text", usage(command.parser), "```", ""]
    rows = option_rows(command.parser)
    lines += ["| option | meaning | default |", "|---|---|---|"]
    lines += [f"| {option} | {cell(text)} | {default} |" for option, text, default in rows]
    lines += ["", "Exit codes:", "", *_code_table(exit_codes(command))]
    return lines


def _code_table(codes: dict[int, str]) -> list[str]:
    return ["| code | meaning |", "|---|---|", *(f"| {c} | {cell(m)} |" for c, m in codes.items())]


def _markdown(text: str) -> str:
    """A description's paragraphs as Markdown text (``<`` shown as written)."""
    paragraphs = [" ".join(part.split()) for part in re.split(r"\n\s*\n", text) if part.strip()]
    return "\n\n".join(paragraphs).replace("<", "&lt;")


def _anchor(heading: str) -> str:
    """The id mkdocs' table of contents gives a heading of plain words."""
    return re.sub(r"[^\w]+", "-", heading.lower()).strip("-")


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
