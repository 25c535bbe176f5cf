"""Who may import whom, as the package table in docs/architecture.md says, checked on every import.

What crosses a package boundary is a file format, a metric name or a small public API.
An import against the table couples two packages that must be able to change (and, for
``serving``, ship) apart, so every ``import`` and ``from … import`` statement in each
package is read, including those inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROJECT_PACKAGES = ("contracts", "research", "training", "compression", "serving", "ops")

# The packages each one may import besides itself (the ``slipway`` CLI may import all).
ALLOWED = {
    "contracts": set(),
    "research": {"contracts"},
    "training": {"research", "contracts"},
    "compression": {"research", "training", "contracts"},
    "serving": {"contracts"},
    "ops": {"serving", "contracts"},
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted module)`` of every absolute import, ``from a import b`` giving ``a.b``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """``(line, top-level package)`` of every absolute import in a file."""
    return [(line, module.split(".")[0]) for line, module in imported_modules(path)]


def forbidden_imports(package: str) -> list[str]:
    allowed = ALLOWED[package] | {package}
    return [
        f"{path.relative_to(ROOT)}:{line}: imports {imported}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, imported in imported_packages(path)
        if imported in PROJECT_PACKAGES + ("slipway", "tests", "benchmarks")
        and imported not in allowed
    ]


@pytest.mark.parametrize("package", PROJECT_PACKAGES)
def test_package_imports_only_what_the_design_allows(package: str) -> None:
    assert forbidden_imports(package) == []


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text("def load():\n    from training.export import save\n    import ops.cli\n")
    assert imported_packages(module) == [(2, "training"), (3, "ops")]


def test_every_package_of_the_table_exists() -> None:
    on_disk = {
        path.parent.name
        for path in ROOT.glob("*/__init__.py")
        if path.parent.name not in ("tests", "benchmarks", "slipway")
    }
    assert on_disk == set(PROJECT_PACKAGES)


def test_test_modules_share_helpers_only_through_tests_support() -> None:
    # A helper has one copy, and a test module can be moved or deleted on its own.
    tests = ROOT / "tests"
    found = [
        f"{path.relative_to(ROOT)}:{line}: imports {module}"
        for path in sorted(tests.rglob("*.py"))
        if (tests / "support") not in path.parents
        for line, module in imported_modules(path)
        if module.startswith("tests.") and not module.startswith("tests.support.")
    ]
    assert found == []
