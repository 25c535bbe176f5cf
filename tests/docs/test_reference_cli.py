"""The CLI reference covers every command, and every exit code a command returns."""

from __future__ import annotations

import ast
import importlib
import inspect
from types import ModuleType

import pytest

from slipway.cli_reference import (
    COMMON_EXIT_CODES,
    EXIT_CODES,
    commands,
    documented_exit_codes,
    exit_codes,
    leaves,
    render,
    split_exit_codes,
)

LEAVES = list(leaves(commands()))


def test_every_command_has_a_section() -> None:
    page = render()
    names = [command.name for command in LEAVES]
    assert {"slipway canary start", "slipway balancer nginx", "slipway routing serve"} <= set(names)
    missing = [name for name in names if f"# {name}\n" not in page]
    assert missing == []


def test_every_command_says_what_success_means() -> None:
    vague = [c.name for c in LEAVES if exit_codes(c)[0] == COMMON_EXIT_CODES[0]]
    assert vague == [], "document these commands' exit codes in their --help or EXIT_CODES"


def test_exit_codes_are_listed_once_per_command() -> None:
    names = {command.name for command in LEAVES}
    assert sorted(set(EXIT_CODES) - names) == [], "EXIT_CODES names no such command"
    twice = [c.name for c in LEAVES if c.name in EXIT_CODES and documented_exit_codes(c)]
    assert twice == [], "these commands document their exit codes: drop them from EXIT_CODES"


def returned_codes(module: ModuleType) -> set[int]:
    """The exit codes a handler module returns as a literal or a named constant
    (``return 1``, ``return EXIT_REFUSED``, ``return 0 if ok else 1``)."""
    codes = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if not isinstance(node, ast.Return) or node.value is None:
            continue
        value = node.value
        for candidate in [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]:
            code = _constant(module, candidate)
            if isinstance(code, int) and not isinstance(code, bool):
                codes.add(code)
    return codes


def _constant(module: ModuleType, node: ast.expr) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id.isupper():
        return getattr(module, node.id, None)
    if isinstance(node, ast.Attribute) and node.attr.isupper():
        owner = _constant(module, node.value) if isinstance(node.value, ast.Attribute) else None
        owner = owner or getattr(module, getattr(node.value, "id", ""), None)
        return getattr(owner, node.attr, None)
    return None


HANDLER_MODULES = sorted({c.parser.get_default("handler").__module__ for c in LEAVES})


@pytest.mark.parametrize("module_name", HANDLER_MODULES)
def test_every_code_a_command_returns_is_documented(module_name: str) -> None:
    module = importlib.import_module(module_name)
    own = [c for c in LEAVES if c.parser.get_default("handler").__module__ == module_name]
    documented = {code for command in own for code in exit_codes(command)}
    assert returned_codes(module) - documented == set()


def test_the_scan_reads_literals_constants_and_both_branches() -> None:
    module = importlib.import_module("research.data.cli")
    assert {0, 1, 2, 3} <= returned_codes(module)  # EXIT_REFUSED is 3
    assert returned_codes(importlib.import_module("ops.cli")) == {0, 1}


def test_exit_codes_are_read_from_a_block_or_a_sentence() -> None:
    block = "Train it.\n\nexit codes:\n  0    done\n  2    wrong,\n       really\n"
    assert split_exit_codes(block) == ("Train it.", {0: "done", 2: "wrong, really"})
    sentence = "Check it. Exit codes: 0 passed, 1 failed; 2 not a dataset (a, b)."
    assert split_exit_codes(sentence) == (
        "Check it.",
        {0: "passed", 1: "failed", 2: "not a dataset (a, b)"},
    )
    assert split_exit_codes("Nothing said.") == ("Nothing said.", {})
