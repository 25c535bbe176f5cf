"""The guides' commands run as written: each guide's runnable blocks, in order, in one shell.

Running a guide starts TensorFlow many times, servers and worker groups, so those runs are
in the process tier (``make test-all``). Finding the blocks is fast and runs in every tier,
so a guide whose marks were lost fails at once rather than passing with nothing to run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support.guides import (
    BLOCK_MARKER,
    Block,
    guide_script,
    run_guide,
    runnable_blocks,
)

ROOT = Path(__file__).resolve().parents[2]
GUIDES = ROOT / "docs" / "guides"
GUIDE_NAMES = ("researcher.md", "ops.md", "client.md")
# A guide ends in a first success after several steps, each with commands to run.
MIN_BLOCKS = 5
# Minutes each on a quiet machine; the bound leaves room for a busy one.
RUN_TIMEOUT_S = 1200.0


@pytest.mark.parametrize("name", GUIDE_NAMES)
def test_each_guide_has_runnable_shell_blocks(name: str) -> None:
    blocks = runnable_blocks(GUIDES / name)
    assert len(blocks) >= MIN_BLOCKS, f"{name}: {len(blocks)} runnable blocks"
    assert {block.language for block in blocks} == {"sh"}
    script = guide_script(blocks)
    positions = [script.index(block.text) for block in blocks]
    assert positions == sorted(positions), "the blocks run in the guide's order"


def test_only_blocks_marked_runnable_are_taken(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n"
        "\n"
        "```sh {.runnable}\n"
        "echo one\n"
        "```\n"
        "\n"
        "```sh\n"
        "echo shown, not run\n"
        "```\n"
        "\n"
        "````markdown\n"
        "```sh {.runnable}\n"
        "echo quoted inside another block\n"
        "```\n"
        "````\n"
        "\n"
        "```python {.runnable}\n"
        "print('two')\n"
        "print('lines')\n"
        "```\n"
    )
    assert runnable_blocks(page) == [
        Block(page, 3, "sh", "echo one"),
        Block(page, 17, "python", "print('two')\nprint('lines')"),
    ]


def test_a_block_never_closed_is_an_error(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n```sh {.runnable}\necho one\n")
    with pytest.raises(ValueError, match=r"page.md:3: a code block that is never closed"):
        runnable_blocks(page)


def test_the_script_stops_at_the_first_failure_and_names_each_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```sh {.runnable}\ntrue\n```\n\n```sh {.runnable}\nfalse | cat\n```\n")
    script = guide_script(runnable_blocks(page))
    assert script.startswith("set -euo pipefail\n")
    assert f"printf '\\n{BLOCK_MARKER} page.md:1\\n' >&2\ntrue\n" in script
    assert f"printf '\\n{BLOCK_MARKER} page.md:5\\n' >&2\nfalse | cat\n" in script


def test_only_shell_blocks_can_run(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python {.runnable}\nprint(1)\n```\n")
    with pytest.raises(ValueError, match=r"must be sh or bash: page.md:1"):
        guide_script(runnable_blocks(page))


@pytest.mark.process
@pytest.mark.parametrize("name", GUIDE_NAMES)
def test_guide_runs_as_written(name: str, tmp_path: Path) -> None:
    """In the set-up each guide tells its reader to make: a scratch directory, ``REPO``
    naming the clone, and the project's virtualenv first on ``PATH``."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {
        **os.environ,
        "REPO": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    run = run_guide(GUIDES / name, workdir, env, timeout=RUN_TIMEOUT_S)
    assert run.returncode == 0, (
        f"{name}: the block at {run.last_block()} "
        + ("timed out" if run.returncode is None else f"failed (exit {run.returncode})")
        + f"; the end of its output:\n{run.tail()}"
    )
    assert run.left_running == [], f"{name} left processes running: {run.left_running}"
