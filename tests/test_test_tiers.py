"""Every test that starts a process sits in the process tier, read from the code before any runs.

``make test`` runs ``-m "not process and not slow"`` and stays fast only while no test in it
starts a child process, a server process or a cluster. This guard reads every test module: a test
(or a fixture it asks for) that calls something which starts a process must carry
``@pytest.mark.process``, on itself, its class or its module's ``pytestmark``.

What "starts a process" means is derived, not listed by hand: the primitives below, and any
function or class in the project's packages or in ``tests/support`` that calls one, directly
or through another such function. ``tests/support/tiers.py`` watches the same rule while the
fast tier runs, which also catches a process started through code this reading cannot follow
(a CLI command chosen at run time, say).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from slipway import PACKAGES

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# Calls that start a process, by the dotted name the code imports them under. (A process
# pool starts its workers on its first task, not when it is made: the run-time watch sees it.)
PRIMITIVES = frozenset(
    {
        "subprocess.run",
        "subprocess.Popen",
        "subprocess.call",
        "subprocess.check_call",
        "subprocess.check_output",
        "multiprocessing.Process",
        "multiprocessing.Pool",
        "os.fork",
        "os.system",
        "os.posix_spawn",
        "asyncio.create_subprocess_exec",
        "asyncio.create_subprocess_shell",
        "distributed.LocalCluster",
        "dask.distributed.LocalCluster",
    }
)


def module_name(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def import_table(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> the dotted name it stands for, from the module's imports."""
    package = module.rsplit(".", 1)[0]
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                names[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def dotted(node: ast.AST, imports: dict[str, str]) -> str | None:
    """The dotted name an expression like ``a.b.c`` refers to, resolved through the imports."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(imports.get(node.id, node.id))
    return ".".join(reversed(parts))


def runs_git(call: ast.Call) -> bool:
    """``subprocess.…(["git", …])``: quick, never Python, allowed anywhere (as in tiers.py)."""
    command = call.args[0] if call.args else None
    return (
        isinstance(command, ast.List | ast.Tuple)
        and bool(command.elts)
        and isinstance(command.elts[0], ast.Constant)
        and command.elts[0].value == "git"
    )


def unconditional(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and what it holds, except what runs only on a branch (``if``, ``match``,
    an exception handler): a function that starts a process only for some arguments, such
    as ``train(workers=2)``, does not make every caller a process test."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.If | ast.IfExp | ast.Match | ast.ExceptHandler):
            yield from unconditional(child)


def called(body: ast.AST, imports: dict[str, str]) -> set[str]:
    """Every dotted name ``body`` always calls (or instantiates), git commands aside."""
    return {
        name
        for node in unconditional(body)
        if isinstance(node, ast.Call)
        and not runs_git(node)
        and (name := dotted(node.func, imports))
    }


# A class starts a process when making, entering or starting it does; a method that starts
# one later, on demand (a pool made for the first large request), is left to the run-time watch.
STARTING_METHODS = frozenset({"__init__", "__enter__", "__aenter__", "start", "run"})


def starting_part(node: ast.AST) -> list[ast.AST]:
    """What runs when ``node`` is called: a function's body, or a class's starting methods
    and the methods they call on ``self``."""
    if not isinstance(node, ast.ClassDef):
        return [node]
    methods = {
        method.name: method
        for method in node.body
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    reached = set(STARTING_METHODS) & set(methods)
    while (
        grown := {
            call.func.attr
            for name in reached
            for call in unconditional(methods[name])
            if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "self"
            and call.func.attr in methods
        }
        - reached
    ):
        reached |= grown
    return [methods[name] for name in sorted(reached)]


def definitions(
    tree: ast.Module,
) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    yield from (
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    )


def source_files() -> Iterable[Path]:
    for root in PACKAGES:
        yield from sorted((ROOT / root).rglob("*.py"))
    yield from sorted((TESTS / "support").rglob("*.py"))


def process_starters() -> frozenset[str]:
    """Dotted names of the project's functions and classes that start a process, transitively."""
    calls: dict[str, set[str]] = {}
    for path in source_files():
        module = module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imports = import_table(tree, module)
        for node in definitions(tree):
            local = {name: f"{module}.{name}" for name in (d.name for d in definitions(tree))}
            calls[f"{module}.{node.name}"] = {
                local.get(name, name)
                for part in starting_part(node)
                for name in called(part, imports | local)
            }
    starters = set(PRIMITIVES)
    while grown := {name for name, made in calls.items() if made & starters} - starters:
        starters |= grown
    return frozenset(starters)


def is_process_mark(node: ast.AST) -> bool:
    """``pytest.mark.process`` (or a call of it), alone or in a list of marks."""
    if isinstance(node, ast.List | ast.Tuple):
        return any(is_process_mark(element) for element in node.elts)
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, ast.Attribute) and node.attr == "process"


def marked_by_pytestmark(body: list[ast.stmt]) -> bool:
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        and is_process_mark(node.value)
        for node in body
    )


def is_fixture(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)


class Module:
    """One test module (or conftest) read for what its tests and fixtures start."""

    def __init__(self, path: Path, starters: frozenset[str], root: Path = ROOT) -> None:
        self.path = path
        module = module_name(path, root)
        self.tree = ast.parse(path.read_text(encoding="utf-8"))
        self.imports = import_table(self.tree, module)
        self.marked = marked_by_pytestmark(self.tree.body)
        self.functions = [
            node
            for node in ast.walk(self.tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        helpers = {f.name for f in self.functions if not is_fixture(f)}
        starting = set(starters)
        # Module-local helpers that start a process count as starters too.
        while (
            grown := {
                f.name for f in self.functions if f.name in helpers and self.calls(f) & starting
            }
            - starting
        ):
            starting |= grown
        self.starting = frozenset(starting)

    def calls(self, function: ast.AST) -> set[str]:
        return called(function, self.imports)

    def fixtures(self) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        return {f.name: f for f in self.functions if is_fixture(f)}


def fixtures_that_start(modules: list[Module]) -> set[str]:
    """Fixture names (from conftests, shared plugins and the module) whose setup starts a process."""
    fixtures = {name: (m, f) for m in modules for name, f in m.fixtures().items()}
    starting: set[str] = set()
    while (
        grown := {
            name
            for name, (module, function) in fixtures.items()
            if module.calls(function) & module.starting
            or {a.arg for a in function.args.args} & starting
        }
        - starting
    ):
        starting |= grown
    return starting


def shared_fixture_modules(path: Path, starters: frozenset[str]) -> list[Module]:
    """The conftests above ``path`` and the plugin modules the root conftest registers."""
    conftests = [
        directory / "conftest.py"
        for directory in [path.parent, *path.parent.parents]
        if (directory / "conftest.py").exists() and TESTS in [directory, *directory.parents]
    ]
    plugins = [TESTS / "support" / f"{name}.py" for name in ("fixtures", "serving_fixtures")]
    return [Module(p, starters) for p in conftests + plugins if p.exists()]


def unmarked_starting_tests(path: Path, starters: frozenset[str], root: Path = ROOT) -> list[str]:
    module = Module(path, starters, root)
    if module.marked:
        return []
    starting_fixtures = fixtures_that_start([*shared_fixture_modules(path, starters), module])
    found = []
    for scope in [module.tree, *(n for n in module.tree.body if isinstance(n, ast.ClassDef))]:
        if isinstance(scope, ast.ClassDef) and (
            marked_by_pytestmark(scope.body) or any(map(is_process_mark, scope.decorator_list))
        ):
            continue
        for test in scope.body:
            if not isinstance(test, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if not test.name.startswith("test") or any(map(is_process_mark, test.decorator_list)):
                continue
            starts = module.calls(test) & module.starting
            asks = {a.arg for a in test.args.args} & starting_fixtures
            if starts or asks:
                what = sorted(starts) or [f"fixture {name}" for name in sorted(asks)]
                found.append(f"{path.relative_to(root)}::{test.name} starts a process: {what[0]}")
    return found


def test_every_test_that_starts_a_process_is_in_the_process_tier() -> None:
    starters = process_starters()
    found = [
        line
        for path in sorted(TESTS.rglob("test_*.py"))
        for line in unmarked_starting_tests(path, starters)
    ]
    assert found == [], "mark these @pytest.mark.process:\n" + "\n".join(found)


def test_the_guard_sees_direct_helper_and_fixture_starts(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        "import subprocess\n"
        "import pytest\n"
        "def start():\n"
        "    return subprocess.Popen(['sleep', '1'])\n"
        "@pytest.fixture\n"
        "def server():\n"
        "    yield start()\n"
        "def test_direct():\n"
        "    subprocess.run(['true'])\n"
        "def test_helper():\n"
        "    start()\n"
        "def test_fixture(server):\n"
        "    pass\n"
        "@pytest.mark.process\n"
        "def test_marked(server):\n"
        "    pass\n"
        "def test_quiet():\n"
        "    assert subprocess.CalledProcessError\n",
        encoding="utf-8",
    )
    found = unmarked_starting_tests(tmp_path / "test_sample.py", PRIMITIVES, root=tmp_path)
    assert [line.split("::")[1].split()[0] for line in found] == [
        "test_direct",
        "test_helper",
        "test_fixture",
    ]


def test_project_code_that_starts_processes_is_found() -> None:
    starters = process_starters()
    # Through its own methods, and through other modules' starters.
    assert {
        "serving.process.GatewayProcess",
        "training.supervisor.Supervisor",
        "research.data.dask_runner.connect",
    } <= starters
    # Only on some branches (workers > 1), or only for git: not a process test by itself.
    assert "training.run.train" not in starters
    assert "training.export.git_commit" not in starters


@pytest.mark.process
def test_the_run_time_watch_fails_an_unmarked_test_that_starts_a_process(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.support.tiers"]\n')
    (tmp_path / "test_watched.py").write_text(
        "import subprocess, sys\n"
        "import pytest\n"
        "def test_unmarked():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
        "def test_hides_it():\n"
        "    try:\n"
        "        subprocess.run([sys.executable, '-c', 'pass'])\n"
        "    except RuntimeError:\n"
        "        pass\n"
        "def test_git_is_allowed():\n"
        "    subprocess.run(['git', '--version'], check=True, capture_output=True)\n"
        "@pytest.mark.process\n"
        "def test_marked():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n",
        encoding="utf-8",
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "2 failed, 2 passed" in run.stdout, run.stdout + run.stderr
    assert "test_unmarked" in run.stdout and "test_hides_it" in run.stdout
