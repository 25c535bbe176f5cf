"""Running a guide's commands as a reader would, so the guides cannot rot.

A guide marks the fenced blocks a reader runs with the ``{.runnable}`` attribute after the
language (```` ```sh {.runnable} ````); mkdocs-material renders it as an ordinary shell
block with one more CSS class. Every other block (output, YAML shown for reading, commands
that need a cluster) is left alone.

The runnable blocks of one guide are one reader's session: later blocks use the files and
the shell variables earlier blocks made, and a block may leave a server running in the
background for later blocks to call and stop. So they run in order, in one ``bash`` with
``set -euo pipefail``, in a scratch directory, as the guide's set-up tells the reader to
work. The shell runs in a session of its own: when it ends, or its time is up, every process
still in that session is killed, and a guide that left one running fails — a reader would
have been left with it too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.waiting import wait_until

RUNNABLE_ATTRIBUTE = "{.runnable}"
_FENCE = re.compile(r"^(?P<fence>`{3,})\s*(?P<info>.*)$")
# Printed on standard error before each block, so a failure names the block it was in.
BLOCK_MARKER = "::guide-block"
_MARKER_LINE = re.compile(rf"^{BLOCK_MARKER} (?P<where>\S+)$", re.MULTILINE)
EXIT_GRACE_S = 10.0


@dataclass(frozen=True)
class Block:
    """One runnable block: where it starts (the fence's line, from 1) and its commands."""

    path: Path
    line: int
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def runnable_blocks(path: Path) -> list[Block]:
    """The runnable blocks of a Markdown file, in order.

    A fence opens with three or more backticks and closes with a line of at least as many;
    a block is runnable when its info string is a language followed by ``{.runnable}``.
    """
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, info = opening["fence"], opening["info"].split()
        end = index + 1
        while end < len(lines) and not (
            lines[end].startswith(fence) and not lines[end].strip("`").strip()
        ):
            end += 1
        if end == len(lines):
            raise ValueError(f"{path.name}:{index + 1}: a code block that is never closed")
        if len(info) == 2 and info[1] == RUNNABLE_ATTRIBUTE:
            text = "\n".join(lines[index + 1 : end])
            blocks.append(Block(path, index + 1, info[0], text))
        index = end + 1
    return blocks


def guide_script(blocks: list[Block]) -> str:
    """One bash script running ``blocks`` in order, each announced on standard error."""
    unsupported = [block.where for block in blocks if block.language not in ("sh", "bash")]
    if unsupported:
        raise ValueError(f"runnable blocks must be sh or bash: {', '.join(unsupported)}")
    parts = ["set -euo pipefail"]
    for block in blocks:
        # On a line of its own, even after output that ends without a newline.
        parts += [f"printf '\\n{BLOCK_MARKER} {block.where}\\n' >&2", block.text]
    return "\n".join(parts) + "\n"


@dataclass(frozen=True)
class GuideRun:
    """How a guide's session ended: its exit code (None when its time ran out), its output,
    and the processes it left running (killed since)."""

    returncode: int | None
    output: str
    left_running: list[str]

    def last_block(self) -> str:
        """The block that was running when the session ended."""
        markers = _MARKER_LINE.findall(self.output)
        return markers[-1] if markers else "before the first block"

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def run_guide(path: Path, workdir: Path, env: Mapping[str, str], *, timeout: float) -> GuideRun:
    """Run the runnable blocks of ``path`` in ``workdir`` as one bash session."""
    script = workdir.parent / f"{path.stem}.sh"
    script.write_text(guide_script(runnable_blocks(path)), encoding="utf-8")
    log = workdir.parent / f"{path.stem}.log"
    with log.open("wb") as output:
        shell = subprocess.Popen(
            ["bash", str(script)],
            cwd=workdir,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode: int | None = shell.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            left_running = _stop_session(shell)
    return GuideRun(returncode, log.read_text(encoding="utf-8", errors="replace"), left_running)


def _stop_session(shell: subprocess.Popen) -> list[str]:
    """Kill every process of the shell's session; the command lines of those still there."""
    session = shell.pid  # the shell leads its own session and process group
    left_running = [command for pid, command in _session_processes(session) if pid != shell.pid]
    try:
        os.killpg(session, signal.SIGTERM)
    except ProcessLookupError:
        return left_running
    try:
        wait_until(
            lambda: not _session_processes(session), "the guide's processes to exit",
            timeout=EXIT_GRACE_S,
        )  # fmt: skip
    except AssertionError:
        os.killpg(session, signal.SIGKILL)
    shell.wait(timeout=EXIT_GRACE_S)
    return left_running


def _session_processes(session: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of every live process in ``session``, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # After the command name in parentheses: state, ppid, pgrp, session, ...
            state, _, _, session_id = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:4]
            if int(session_id) != session or state == "Z":
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        found.append((int(entry.name), command))
    return found
