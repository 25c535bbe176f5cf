"""Every ``slipway … --help`` reads as help, and answers without loading TensorFlow."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from slipway.cli import build_parser, leaf_parsers

COMMANDS = {parser.prog: parser for parser in leaf_parsers(build_parser())}


def test_every_command_is_reachable() -> None:
    assert {"slipway train", "slipway tune", "slipway serve", "slipway compress"} <= set(COMMANDS)
    assert any(name.startswith("slipway data ") for name in COMMANDS)
    assert any(name.startswith("slipway canary ") for name in COMMANDS)


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_help_has_no_docstring_markup_and_explains_every_argument(prog: str) -> None:
    parser = COMMANDS[prog]
    text = parser.format_help()
    assert "``" not in text, f"{prog} --help shows reStructuredText markup:\n{text}"
    assert ":func:" not in text and ":class:" not in text
    unexplained = [
        "/".join(action.option_strings) or action.dest
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        and action.help != argparse.SUPPRESS
        and not (action.help or "").strip()
    ]
    assert unexplained == [], f"{prog}: arguments without help: {unexplained}"


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_command_has_a_one_line_summary(prog: str) -> None:
    description = COMMANDS[prog].description or ""
    first = description.strip().splitlines()[0] if description.strip() else ""
    assert first, f"{prog} --help has no description"
    assert not first.startswith(prog), f"{prog}: the description repeats the command name"


@pytest.mark.process  # a fresh interpreter, to see what help imports
def test_help_answers_without_importing_tensorflow() -> None:
    probe = (
        "import sys; from slipway.cli import main\n"
        "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'tensorflow' not in sys.modules, 'help imported TensorFlow'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "usage: slipway train" in result.stdout
